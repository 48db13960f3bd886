#!/bin/bash
# e2e (issue 9): `cmake --install` to a temporary prefix puts the binary, inputs, Slurm scripts,
# docs and the generated modulefiles in place; under Lmod, `module use PREFIX/modulefiles;
# module load kilter` makes `kilter --version` work in a clean environment, for the Lua and the
# Tcl modulefile alike; prerequisite modules are loaded with kilter and unloaded after it; the Tcl
# file is also run by plain tclsh with recording stand-ins for the module commands.
# Usage: lmod.sh KILTER_BINARY (the binary of the build directory to install from).
# Exit 77 (skipped) when Lmod or tclsh is not installed (scripts/install-deps.sh --with-test-extras).
set -euo pipefail

kilter_bin=$(readlink -f "$1")
build_dir=$(dirname "$kilter_bin")
source_dir=${KILTER_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
lmod_init=/usr/share/lmod/lmod/init/bash

fail() { echo "FAIL: $*" >&2; exit 1; }
if [[ ! -r $lmod_init ]]; then
  echo "SKIP: Lmod is not installed ($lmod_init missing; apt-get install lmod)"; exit 77
fi
command -v tclsh >/dev/null || { echo "SKIP: tclsh is not installed (apt-get install tcl)"; exit 77; }
[[ -f $build_dir/cmake_install.cmake ]] || fail "$build_dir is not a CMake build directory"

work=$(mktemp -d /tmp/kilter-lmod.XXXXXX)
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"

version=$("$kilter_bin" --version | awk 'NR == 1 {print $2}')
[[ -n $version ]] || fail "'$kilter_bin --version' printed no version"

# ---- 1. install ---------------------------------------------------------------------------------
cmake --install "$build_dir" --prefix "$prefix" >"$work/install.log" 2>&1 ||
  { cat "$work/install.log" >&2; fail "cmake --install $build_dir --prefix $prefix failed"; }
for f in bin/kilter share/kilter/slurm/train.sbatch share/kilter/slurm/prep.sbatch \
         share/kilter/slurm/stage-in.sh share/kilter/slurm/kilter-task.sh share/kilter/slurm/site.env \
         share/kilter/slurm/README.md share/kilter/inputs/small.ini \
         "modulefiles/kilter/$version.lua" "modulefiles-tcl/kilter/$version"; do
  [[ -f $prefix/$f ]] || fail "cmake --install did not install $f (see $work/install.log)"
done
for f in bin/kilter share/kilter/slurm/train.sbatch share/kilter/slurm/stage-in.sh share/kilter/slurm/kilter-task.sh; do
  [[ -x $prefix/$f ]] || fail "$f is installed without execute permission"
done
grep -q "\"$prefix\"" "$prefix/modulefiles/kilter/$version.lua" ||
  fail "the Lua modulefile does not name the install prefix $prefix"
echo "ok: installed to $prefix"

# Runs a bash snippet in a clean environment with Lmod loaded (as a batch job or a login would).
with_lmod() {
  env -i HOME="$work" PATH=/usr/bin:/bin LMOD_REDIRECT=yes bash -c "
    set -euo pipefail
    source $lmod_init
    $1" 2>&1
}

# ---- 2. module load kilter (Lua and Tcl) ---------------------------------------------------------
# The installed modulefile loads the site's prerequisite modules (e.g. "cuda" when the CUDA
# backend is built); this machine has none, so empty stand-ins with those names are provided.
stubs="$work/site-modules"
mkdir -p "$stubs"
cuda_module=$(sed -n 's/^KILTER_CUDA_MODULE:[A-Z]*=//p' "$build_dir/CMakeCache.txt")
prereqs=$(sed -n 's/^KILTER_MODULE_PREREQS:[A-Z]*=//p' "$build_dir/CMakeCache.txt")
if grep -q "cuda" <<<"$("$prefix/bin/kilter" --version)"; then prereqs="$prereqs $cuda_module"; fi
for m in $prereqs; do
  mkdir -p "$stubs/$(dirname "$m")"
  echo "-- stand-in for the site's $m module (test only)" > "$stubs/$m.lua"
done
for tree in modulefiles modulefiles-tcl; do
  out=$(with_lmod "
    module use $stubs
    module use $prefix/$tree
    module load kilter
    echo \"which=\$(command -v kilter)\"
    echo \"KILTER_ROOT=\$KILTER_ROOT\"
    kilter --version
    module whatis kilter
    module help kilter
    module unload kilter
    echo \"after_unload=\$(command -v kilter || echo none)\"") || { echo "$out" >&2; fail "module load kilter ($tree) failed"; }
  grep -qx "which=$prefix/bin/kilter" <<<"$out" || { echo "$out" >&2; fail "$tree: kilter on PATH is not $prefix/bin/kilter"; }
  grep -qx "KILTER_ROOT=$prefix" <<<"$out" || { echo "$out" >&2; fail "$tree: KILTER_ROOT is not $prefix"; }
  grep -qx "kilter $version" <<<"$out" || { echo "$out" >&2; fail "$tree: 'kilter --version' did not print 'kilter $version'"; }
  grep -q "^backends: " <<<"$out" || { echo "$out" >&2; fail "$tree: 'kilter --version' printed no backends line"; }
  grep -q "Version: $version" <<<"$out" || { echo "$out" >&2; fail "$tree: module whatis lacks 'Version: $version'"; }
  grep -q "train.sbatch" <<<"$out" || { echo "$out" >&2; fail "$tree: module help does not mention train.sbatch"; }
  grep -qx "after_unload=none" <<<"$out" || { echo "$out" >&2; fail "$tree: kilter stays on PATH after module unload"; }
  echo "ok: module load kilter ($tree) -> kilter $version, KILTER_ROOT, whatis, help, unload"
done

# ---- 3. prerequisites are loaded with kilter and unloaded after it --------------------------------
mkdir -p "$work/deps/kilter-test-mpi" "$work/deps/kilter-test-hdf5"
echo 'setenv("KILTER_TEST_MPI_LOADED", "yes")' >"$work/deps/kilter-test-mpi/4.1.lua"
echo 'setenv("KILTER_TEST_HDF5_LOADED", "yes")' >"$work/deps/kilter-test-hdf5/1.10.lua"
cmake -DKILTER_MODULE_ROOT="$prefix" -DKILTER_VERSION="$version" -DKILTER_BACKENDS="cpu mpi" \
      -DKILTER_MODULE_PREREQS="kilter-test-mpi kilter-test-hdf5/1.10" -DKILTER_MODULE_OUTPUT_DIR="$work/gen" \
      -P "$source_dir/modulefiles/write_modulefiles.cmake" || fail "write_modulefiles.cmake failed"
for tree in modulefiles modulefiles-tcl; do
  out=$(with_lmod "
    module use $work/deps
    module use $work/gen/$tree
    module load kilter
    echo \"mpi=\${KILTER_TEST_MPI_LOADED:-no} hdf5=\${KILTER_TEST_HDF5_LOADED:-no}\"
    kilter --version
    module unload kilter
    echo \"after: mpi=\${KILTER_TEST_MPI_LOADED:-no} hdf5=\${KILTER_TEST_HDF5_LOADED:-no}\"") ||
    { echo "$out" >&2; fail "module load kilter with prerequisites ($tree) failed"; }
  grep -qx "mpi=yes hdf5=yes" <<<"$out" || { echo "$out" >&2; fail "$tree: prerequisite modules were not loaded with kilter"; }
  grep -qx "kilter $version" <<<"$out" || { echo "$out" >&2; fail "$tree: kilter --version failed with prerequisites loaded"; }
  if [[ $tree == modulefiles ]]; then   # depends_on() unloads what it loaded; Tcl `module load` need not
    grep -qx "after: mpi=no hdf5=no" <<<"$out" || { echo "$out" >&2; fail "$tree: prerequisites stayed loaded after unloading kilter"; }
  fi
  echo "ok: prerequisites kilter-test-mpi kilter-test-hdf5/1.10 loaded with kilter ($tree)"
done
# A name that would break the generated Lua/Tcl is refused at generation time.
if cmake -DKILTER_MODULE_ROOT="$prefix" -DKILTER_VERSION="$version" -DKILTER_MODULE_PREREQS='bad"name' \
         -DKILTER_MODULE_OUTPUT_DIR="$work/bad" -P "$source_dir/modulefiles/write_modulefiles.cmake" >/dev/null 2>&1; then
  fail "write_modulefiles.cmake accepted the module name 'bad\"name'"
fi

# ---- 4. the Tcl modulefile under plain tclsh (what Environment Modules would evaluate) -----------
cat >"$work/harness.tcl" <<'EOF'
# Stand-ins for the modulefile commands: record what the file asks for.
set ::calls {}
proc module-whatis {text} { lappend ::calls [list whatis $text] }
proc setenv {name value} { lappend ::calls [list setenv $name $value] }
proc prepend-path {name value} { lappend ::calls [list prepend-path $name $value] }
proc conflict {args} { lappend ::calls [list conflict {*}$args] }
proc is-loaded {name} { return 0 }
proc module {args} { lappend ::calls [list module {*}$args] }
source [lindex $argv 0]
ModulesHelp
foreach call $::calls { puts $call }
EOF
tcl_out=$(tclsh "$work/harness.tcl" "$work/gen/modulefiles-tcl/kilter/$version" 2>&1) ||
  { echo "$tcl_out" >&2; fail "tclsh could not evaluate the Tcl modulefile"; }
grep -qx "setenv KILTER_ROOT $prefix" <<<"$tcl_out" || { echo "$tcl_out" >&2; fail "Tcl modulefile: no setenv KILTER_ROOT"; }
grep -qx "prepend-path PATH $prefix/bin" <<<"$tcl_out" || { echo "$tcl_out" >&2; fail "Tcl modulefile: no prepend-path PATH"; }
grep -qx "module load kilter-test-mpi" <<<"$tcl_out" || { echo "$tcl_out" >&2; fail "Tcl modulefile: prerequisite not loaded"; }
grep -q "kilter $version -- data-parallel" <<<"$tcl_out" || { echo "$tcl_out" >&2; fail "Tcl modulefile: ModulesHelp prints no help"; }
echo "ok: Tcl modulefile evaluates under tclsh (setenv, prepend-path, prerequisites, help)"

# ---- 5. DESTDIR staging installs under DESTDIR but names the final prefix -------------------------
DESTDIR="$work/stage" cmake --install "$build_dir" --prefix /opt/kilter-test >"$work/destdir.log" 2>&1 ||
  { cat "$work/destdir.log" >&2; fail "DESTDIR install failed"; }
staged="$work/stage/opt/kilter-test/modulefiles/kilter/$version.lua"
[[ -f $staged ]] || fail "DESTDIR install did not write $staged"
grep -q '"/opt/kilter-test"' "$staged" || fail "DESTDIR install: the modulefile does not name /opt/kilter-test"
[[ ! -e /opt/kilter-test ]] || fail "DESTDIR install wrote outside DESTDIR (/opt/kilter-test exists)"
echo "ok: DESTDIR install names the final prefix"
echo "PASS: lmod"

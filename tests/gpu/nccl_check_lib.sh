# The parts of tests/gpu/nccl-check.sh (sourced by it; see its header): the carried runtime
# (pack_carry, rehearse_carry, cpu_runtime, device_runtime), the reference runs
# (make_references), and the matrix of runs, drills and the table (run_matrix).

# ---- the carried runtime --------------------------------------------------------------------------
# Libraries the GPU machine has or must not take from here: glibc's, the compiler runtime (the
# machine's glibc and libstdc++ are newer than Debian 12's, so binaries built here run there), and
# CUDA's (the toolkit's cudart and cuBLASLt, the machine's NCCL; cuDNN's front library is carried
# apart, as a last resort).
SYSTEM_LIBRARIES='^(libc|libm|libdl|libpthread|librt|libresolv|libutil|libanl|libnsl|libmvec|ld-linux-x86-64|libstdc\+\+|libgcc_s)\.so'
CUDA_LIBRARIES='^(libcuda|libcudart|libcudnn|libnccl|libcublas|libcublasLt|libnvrtc|libnvidia)'
# Open MPI components left behind: fabrics a one-machine run never uses (UCX, libfabric, verbs,
# PSM), whose libraries the GPU machine lacks. Shared memory and TCP stay.
SKIPPED_COMPONENTS='(ucx|ofi|openib|psm|verbs)'

ompi_path() {  # ompi_path KEY: a directory of ompi_info --path all (Prefix, Pkglibdir, Pkgdatadir)
  ompi_info --path all | awk -v k="$1:" '$1 == k {print $2; exit}'
}

# The libraries (absolute paths) the given binaries load, less the system's and CUDA's.
carried_libraries() {
  local f
  for f in "$@"; do ldd "$f" 2>/dev/null; done | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
    while read -r name path; do
      [[ $name =~ $SYSTEM_LIBRARIES || $name =~ $CUDA_LIBRARIES ]] || echo "$path"
    done | sort -u
}

pack_carry() {
  [[ -x $build/kilter ]] || die "no $build/kilter: build the CUDA build first (cmake --build build)"
  "$build/kilter" --version | grep -qw nccl || die "$build/kilter has no NCCL backend (kilter --version); configure with CUDA and NCCL"
  command -v ompi_info >/dev/null || die "packing needs Open MPI's ompi_info here"
  local prefix pkglib pkgdata pmix_lib pmix_prefix stage
  prefix=$(ompi_path Prefix) pkglib=$(ompi_path Pkglibdir) pkgdata=$(ompi_path Pkgdatadir)
  pmix_lib=$(ldd "$pkglib"/mca_pmix_ext*.so 2>/dev/null | awk '/libpmix/ {print $3; exit}')
  pmix_prefix=$(dirname "$(dirname "$(readlink -f "$pmix_lib")")")
  stage=$(mktemp -d "${TMPDIR:-/tmp}/kilter-nccl-stage.XXXXXX")
  say "packing the runtime in $stage (Open MPI prefix $prefix, PMIx $pmix_prefix)"
  mkdir -p "$stage/bin" "$stage/lib" "$stage/lib-fallback" "$stage/ompi/bin" "$stage/ompi/${pkglib#"$prefix"/}" \
           "$stage/ompi/${pkgdata#"$prefix"/}" "$stage/pmix/lib/pmix" "$stage/pmix/share"
  strip -o "$stage/bin/kilter" "$build/kilter"
  # The communicator's exact-sum collectives (tests/gpu/gpu_nccl_test.cpp), run first on the device.
  [[ -x $build/kilter_gpu_nccl_test ]] && strip -o "$stage/bin/kilter_gpu_nccl_test" "$build/kilter_gpu_nccl_test"
  # The sparsely backed buffers the parameter shards hold (tests/gpu/gpu_vmm_test.cpp), one process.
  [[ -x $build/kilter_gpu_vmm_test ]] && strip -o "$stage/bin/kilter_gpu_vmm_test" "$build/kilter_gpu_vmm_test"
  # The model's side of parameters under bf16 storage (the working copy gathered unit by unit,
  # tests/gpu/gpu_distributed_optimizer_test.cpp), one process.
  [[ -x $build/kilter_gpu_distributed_optimizer_test ]] &&
    strip -o "$stage/bin/kilter_gpu_distributed_optimizer_test" "$build/kilter_gpu_distributed_optimizer_test"
  cp "$(readlink -f "$(command -v mpirun)")" "$stage/ompi/bin/mpirun"
  cp "$(readlink -f "$(command -v orted)")" "$stage/ompi/bin/orted"
  local component
  for component in "$pkglib"/*.so; do
    [[ $(basename "$component") =~ $SKIPPED_COMPONENTS ]] || cp "$component" "$stage/ompi/${pkglib#"$prefix"/}/"
  done
  cp -r "$pkgdata"/. "$stage/ompi/${pkgdata#"$prefix"/}/"
  cp "$pmix_prefix"/lib/pmix/*.so "$stage/pmix/lib/pmix/"
  [[ -d $pmix_prefix/share/pmix ]] && cp -r "$pmix_prefix/share/pmix" "$stage/pmix/share/"
  local lib
  for lib in $(carried_libraries "$stage"/bin/* "$stage"/ompi/bin/* "$stage/ompi/${pkglib#"$prefix"/}"/*.so \
                 "$stage"/pmix/lib/pmix/*.so); do
    cp -L "$lib" "$stage/lib/"
  done
  local cudnn_front
  cudnn_front=$(ldd "$build/kilter" | awk '/libcudnn\.so/ {print $3}')
  [[ -n $cudnn_front ]] && cp -L "$cudnn_front" "$stage/lib-fallback/"
  echo "  $(find "$stage/lib" -type f | wc -l) libraries, $(find "$stage/ompi" -name '*.so' | wc -l) Open MPI components;" \
       "unpacked: $(du -sh "$stage" | cut -f1)"
  mkdir -p "$carry"
  tar -C "$stage" -cf - . | xz -T0 -6 > "$carry/kilter-nccl.tar.xz" || die "packing failed"
  rm -rf "$stage"
  make_datasets
  say "carry: $carry ($(du -sh "$carry" | cut -f1)): kilter-nccl.tar.xz $(du -h "$carry/kilter-nccl.tar.xz" | cut -f1)"
}

make_datasets() {
  mkdir -p "$carry/data"
  "$build/kilter" prep synth --docs 600 --lengths lognormal:4,0.9,300 --vocab 97 --shards 3 --seed 7 \
    --out "$carry/data/base" >/dev/null 2>&1 || die "kilter prep synth (base) failed"
  "$build/kilter" prep synth --docs 600 --lengths lognormal:4.5,0.9,300 --vocab 97 --shards 3 --seed 7 \
    --out "$carry/data/cut" >/dev/null 2>&1 || die "kilter prep synth (cut) failed"
}

# RUNTIME_ENV: `env ...` that runs a command on the runtime unpacked in $1 (its libraries first,
# then the GPU libraries found by find_gpu_libraries, then the fallbacks). Python and the
# system's tools run without it: the carried libraries are Debian 12's.
set_runtime_env() {
  local rt=$1
  RUNTIME_ENV=(env "LD_LIBRARY_PATH=$rt/lib${GPU_LIBRARY_PATH:+:$GPU_LIBRARY_PATH}:$rt/lib-fallback"
               "OPAL_PREFIX=$rt/ompi" "PMIX_PREFIX=$rt/pmix" "PATH=$rt/ompi/bin:$PATH"
               OMPI_MCA_btl=self,vader,tcp OMPI_MCA_pml=ob1 OMPI_MCA_btl_tcp_if_include=lo
               OMPI_MCA_oob_tcp_if_include=lo OMPI_MCA_btl_vader_single_copy_mechanism=none)
  MPIEXEC=$rt/ompi/bin/mpirun
  KILTER=$rt/bin/kilter
}

unpack_runtime() {  # unpack_runtime DIR (with Python's lzma where xz is missing)
  mkdir -p "$1"
  if command -v xz >/dev/null; then
    xz -dc "$carry/kilter-nccl.tar.xz" | tar -C "$1" -xf - || die "cannot unpack $carry/kilter-nccl.tar.xz"
  else
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$carry/kilter-nccl.tar.xz" "$1" \
      || die "cannot unpack $carry/kilter-nccl.tar.xz"
  fi
}

# The runtime with the system's Open MPI, PMIx and every library the carry holds hidden (a
# private mount namespace), as on a machine without them: one 2-rank CPU run through the
# launcher must train. Skipped with a note where a mount namespace cannot be made.
rehearse_carry() {
  local rt
  rt=$(mktemp -d "${TMPDIR:-/tmp}/kilter-nccl-rehearsal.XXXXXX")
  unpack_runtime "$rt"
  if ! unshare -m --propagation private true 2>/dev/null; then
    say "rehearsal skipped: no private mount namespace here (unshare -m needs root)"
    rm -rf "$rt"
    return 0
  fi
  say "rehearsal: the unpacked runtime with the system's Open MPI, PMIx, HDF5, oneDNN ... hidden"
  GPU_LIBRARY_PATH="" set_runtime_env "$rt"
  # Hidden: each carried library's system copy (but those mount and bash need, to finish), the
  # system's mpirun and orted, and Open MPI's and PMIx's trees.
  local keep hide=() lib real pkglib
  keep=$(ldd "$(command -v mount)" "$(command -v bash)" | awk '$2 == "=>" {print $1}' | sort -u)
  for lib in "$rt"/lib/*; do
    grep -qx "$(basename "$lib")" <<<"$keep" && continue
    real=$(readlink -f "/usr/lib/x86_64-linux-gnu/$(basename "$lib")" 2>/dev/null) && [[ -f $real ]] && hide+=("$real")
  done
  hide+=("$(readlink -f "$(command -v mpirun)")" "$(readlink -f "$(command -v orted)")")
  pkglib=$(ompi_path Pkglibdir)
  local script="set -e
for f in ${hide[*]}; do mount --bind /dev/null \"\$f\"; done
for d in $(dirname "$(dirname "$pkglib")") $(ompi_path Pkgdatadir) /etc/openmpi /usr/lib/x86_64-linux-gnu/pmix2; do
  if [ -d \"\$d\" ]; then mount -t tmpfs -o size=4k tmpfs \"\$d\"; fi
done
cd $rt
${RUNTIME_ENV[*]} MPIEXEC=$MPIEXEC bash $root/tests/gpu/ranks-on-one-gpu.sh 2 -- $KILTER train --data.dir=$carry/data/base \\
  --model.n_layer=1 --model.n_head=2 --model.n_embd=16 --model.block_size=64 --data.max_tokens=256 \\
  --train.tokens_per_step=512 --train.steps=2 --train.backend=cpu --output.dir=$rt/runs/rehearsal"
  if unshare -m --propagation private bash -c "$script" >"$rt/rehearsal.log" 2>&1 &&
     grep -q "kilter: done: 2 steps" "$rt/rehearsal.log"; then
    say "rehearsal passed: $(grep -m1 'kilter: done' "$rt/rehearsal.log")"
    rm -rf "$rt"
    return 0
  fi
  cat "$rt/rehearsal.log"
  die "rehearsal failed: the carried runtime does not run without the system's libraries (log above)"
}

# cudart, cuBLASLt (opened on first use), cuDNN's front library (linked) and NCCL on the GPU
# machine: the toolkit's, the loader cache's, or those of Python wheels (nvidia-nccl-cu13, ...).
find_gpu_libraries() {
  GPU_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib
  local lib dir found
  for lib in libnccl.so.2 libcudnn.so.9 libcublasLt.so.13; do
    found=""
    for dir in /usr/local/cuda/lib64 /usr/local/cuda/lib; do [[ -e $dir/$lib ]] && found=$dir/$lib && break; done
    [[ -z $found ]] && found=$(ldconfig -p 2>/dev/null | awk -v l="$lib" '$1 == l {print $NF; exit}')
    [[ -z $found ]] && found=$(find /usr/local/lib /usr/lib/python3* /opt /root/.local -path '*nvidia*' -name "$lib" 2>/dev/null | head -1)
    echo "  $lib: ${found:-not found}"
    [[ -n $found ]] && GPU_LIBRARY_PATH=$GPU_LIBRARY_PATH:$(dirname "$found")
    [[ -z $found && $lib == libnccl.so.2 ]] && die "no libnccl.so.2 on this machine (toolkit, loader cache, Python wheels): NCCL does not travel (~200 MB)"
  done
}

device_runtime() {
  [[ -f $carry/kilter-nccl.tar.xz ]] || die "no $carry/kilter-nccl.tar.xz: run tests/gpu/nccl-check.sh --build-only on a build machine and bring $carry"
  # KILTER_NCCL_BACKEND=cpu rehearses this device flow (the unpacked runtime, its mpirun) on a
  # machine without a GPU.
  backend=${KILTER_NCCL_BACKEND:-cuda}
  BACKEND_ARGS=()
  # The communication paths are the subject; cuDNN's per-shape trials would take the time.
  [[ $backend == cuda ]] && BACKEND_ARGS=(--train.attention=cublaslt)
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,compute_mode --format=csv,noheader
  if nvidia-smi --query-gpu=compute_mode --format=csv,noheader 2>/dev/null | grep -qi exclusive; then
    die "the GPU is in an exclusive compute mode: several ranks cannot share it (this check changes no GPU setting)"
  fi
  # On a machine with several GPUs the ranks would spread over them; the subject is one GPU.
  if [[ $backend == cuda && -z ${CUDA_VISIBLE_DEVICES:-} && $(nvidia-smi -L 2>/dev/null | wc -l) -gt 1 ]]; then
    export CUDA_VISIBLE_DEVICES=0
    echo "  several GPUs here: every rank uses GPU 0 (CUDA_VISIBLE_DEVICES=0)"
  fi
  find_gpu_libraries
  work=$(mktemp -d "${TMPDIR:-/tmp}/kilter-nccl-check.XXXXXX")
  unpack_runtime "$work/runtime"
  set_runtime_env "$work/runtime"
  "${RUNTIME_ENV[@]}" "$KILTER" --version | sed 's/^/  /'
  "${RUNTIME_ENV[@]}" ldd "$KILTER" | awk '$1 ~ /libnccl|libcudnn|libcudart/ || /not found/ {print "  " $1, $2, $3}'
  # The carried libraries are Debian 12's: glibc 2.36 at most (libevent's arc4random), 2.34 for the rest.
  echo "  $(ldd --version 2>&1 | head -1)"
  local binary
  for binary in "$KILTER" "$MPIEXEC" "$work/runtime/ompi"/lib/*/openmpi/lib/openmpi3/mca_btl_tcp.so; do
    if "${RUNTIME_ENV[@]}" ldd "$binary" 2>&1 | grep "not found" | sed 's/^/  /' | grep .; then
      die "$(basename "$binary") misses libraries here (above): the carried runtime cannot run on this machine"
    fi
  done
  references=$carry/reference
}

cpu_runtime() {
  [[ -x $build/kilter ]] || die "no $build/kilter"
  backend=cpu
  BACKEND_ARGS=()
  work=$(mktemp -d "${TMPDIR:-/tmp}/kilter-nccl-check.XXXXXX")
  RUNTIME_ENV=(env)
  MPIEXEC=${MPIEXEC:-mpirun}
  KILTER=$build/kilter
  [[ -d $carry/data/base ]] || make_datasets
  references=$carry/reference
  [[ -d $references ]] || make_references || die "the CPU/MPI references failed"
}

# ---- the runs -----------------------------------------------------------------------------------
# Tiny configs (tests/e2e/invariance.sh's and cut_invariance.sh's): 6 steps, 2 layers of 32.
common_args() {  # common_args DATASET [STEPS [TIMEOUT_S]]: the config of the base or the cut dataset
  local shared=(--model.n_layer=2 --model.n_head=2 --model.n_embd=32 --model.block_size=64 --train.steps=${2:-6}
                --train.warmup=2 --train.lr=3e-3 --output.log_every=1 --output.trace_steps=0
                --data.eval_fraction=0 --comm.timeout_s=${3:-60})
  if [[ $1 == cut ]]; then
    # About one context per rank and step over long pieces: the plan cuts pieces between ranks
    # (comm.device_tflops = 0.1 prices a cut's K/V as a CPU core moves it, as cut_invariance.sh).
    echo "--data.dir=$carry/data/cut ${shared[*]} --data.max_tokens=128 --train.tokens_per_step=256 --comm.device_tflops=0.1"
  else
    echo "--data.dir=$carry/data/base ${shared[*]} --data.max_tokens=256 --train.tokens_per_step=1024"
  fi
}

# The matrix: ID|PATH|RANKS|DATASET|ARGS[|PEER]. The 1-rank runs (base1, cut1) are the references;
# PEER: the ID of another row of the same precision whose losses this one's must match too.
matrix_rows() {
  # Under bf16 (bf16 storage) parameters gathers the bf16 working copy alone and keeps the
  # distributed optimizer's state (the fp32 master of the chunks, the norms widened from the copy):
  # the same working-copy semantics as optimizer's, whose run (fp32 gradients, as parameters
  # reduces them) it must match within the peer bound (tests/gpu/nccl_compare.py). First: the
  # newest path runs first should the time run short.
  if [[ $quick -eq 0 && ${p:-} == bf16 ]]; then
    echo "dopt2f|flat, distributed optimizer, fp32 gradients|2|base|--comm.algo=flat --train.shard=optimizer"
    echo "par2|parameters, groups of 2 (the bf16 copy gathered)|2|base|$PARAMETERS_ARGS|dopt2f"
  fi
  echo "flat2|flat, ZeRO-1 sharded|2|base|--comm.algo=flat --train.shard_optimizer=true"
  [[ $quick -eq 1 ]] || echo "flat4|flat, ZeRO-1 sharded|4|base|--comm.algo=flat --train.shard_optimizer=true"
  echo "hier4|hierarchical 2x2, sharded|4|base|--comm.ranks_per_node=2 --comm.algo=hierarchical --train.shard_optimizer=true"
  echo "cut4|cut pieces (K/V exchange)|4|cut|--comm.algo=flat"
  # HSDP under optimizer: the groups of 2 play the nodes (node reduce-scatter, cross-group
  # all-reduce of the group shard, node all-gather).
  [[ $quick -eq 1 ]] || echo "ohsdp4|optimizer, groups of 2 (HSDP 2x2)|4|base|--comm.ranks_per_node=2 --train.shard=optimizer --train.shard_group=node"
  # Fully sharded parameters (ZeRO-3) in groups of 2: the whole world on 2 ranks, HSDP (2 groups,
  # each chunk all-reduced across them) on 4, with a training sample every 3 steps (rank 0's group
  # sends it the units: SampleFeed); whole pieces, as that mode takes them. Before the unsharded
  # rows: what is newest runs first should the time run short.
  [[ $quick -eq 1 || ${p:-} == bf16 ]] || echo "par2|parameters, groups of 2|2|base|$PARAMETERS_ARGS"
  echo "par4|parameters, groups of 2 (HSDP 2x2), samples|4|base|$PARAMETERS_ARGS --output.sample_every=3"
  # Parameters with pieces cut between ranks: the K/V exchange's NCCL send/recv beside the unit
  # gathers and reduce-scatters on their own communicator (groups of 2, HSDP on 4).
  [[ $quick -eq 1 ]] || echo "parcut4|parameters with cut pieces (K/V exchange)|4|cut|--comm.algo=flat --train.shard=parameters --train.shard_group=2"
  if [[ $quick -eq 0 ]]; then
    echo "flat4u|flat, unsharded|4|base|--comm.algo=flat --train.shard_optimizer=false"
    echo "hier4u|hierarchical 2x2, unsharded|4|base|--comm.ranks_per_node=2 --comm.algo=hierarchical --train.shard_optimizer=false"
    # Under bf16 (bf16 storage) the distributed optimizer: the master sharded, the bf16 working
    # copy all-gathered, the gradients accumulated in bf16 and reduced in fp32 (bf16 rows only:
    # the callers' precision p; fp32's 1e-5 against the 1-rank run does not hold bf16 gradients).
    if [[ ${p:-} == bf16 ]]; then
      echo "dopt2|flat, distributed optimizer, bf16 gradients|2|base|--comm.algo=flat --train.shard=optimizer --train.grad_dtype=bf16"
    fi
  fi
}
PARAMETERS_ARGS="--comm.algo=flat --train.shard=parameters --train.shard_group=2 --data.cut_pieces=false"

precisions() { if [[ $quick -eq 1 ]]; then echo fp32; else echo fp32 bf16; fi; }

# run_leg NAME NP LAUNCH [ARGS...]: `kilter train` on NP ranks, LAUNCH "one-gpu" (through
# ranks-on-one-gpu.sh, with mpirun options $LEG_MPIRUN_OPTIONS) or "mpi" (plain mpirun), log
# NAME.log, run dir runs/NAME. LEG_RC: exit code.
run_leg() {
  local name=$1 np=$2 launch=$3
  shift 3
  local launcher=(bash "$root/tests/gpu/ranks-on-one-gpu.sh" "$np" ${LEG_MPIRUN_OPTIONS:-} --)
  [[ $launch == mpi ]] && launcher=("$MPIEXEC" --allow-run-as-root --oversubscribe --bind-to none -np "$np")
  LEG_RC=0
  timeout "${KILTER_NCCL_RUN_TIMEOUT:-120}" "${RUNTIME_ENV[@]}" MPIEXEC="$MPIEXEC" "${launcher[@]}" \
    "$KILTER" train "$@" --output.dir="runs/$name" </dev/null >"$name.log" 2>&1 || LEG_RC=$?
}

# Why a finished run cannot be compared ("" when it can): its exit code, and on the device the
# evidence that it ran what it should (the cuda backend, NCCL, the test layout's note, cuts).
leg_problem() {  # leg_problem NAME NP BACKEND [cut]
  local name=$1 np=$2 expect_backend=$3
  if [[ $LEG_RC -ne 0 ]]; then
    echo "run failed (exit $LEG_RC): $(grep -m1 -iE 'error|fail' "$name.log" | cut -c1-160)"
    return
  fi
  grep -q "backend $expect_backend" "$name.log" || { echo "the run does not report backend $expect_backend"; return; }
  if [[ $expect_backend == cuda && $np -gt 1 ]]; then
    grep -q "comm nccl/" "$name.log" || { echo "the run does not report comm nccl"; return; }
    grep -q "KILTER_TEST_SHARE_DEVICE=1: ranks" "$name.log" || { echo "no note of ranks sharing the GPU"; return; }
  fi
  if [[ ${4:-} == cut && $np -gt 1 ]]; then
    grep -q "plan cuts pieces between ranks" "$name.log" || echo "the plan cut no piece: the K/V exchange did not run"
  fi
  # A row that asks for training samples prints them (rank 0, fed the units by its group).
  if grep -qE '^sample_every *= *[1-9]' "runs/$name/config.ini" 2>/dev/null; then
    grep -q "^sample at step 3:" "$name.log" || echo "no training sample at step 3"
  fi
}

metrics() { echo "runs/$1/metrics/rank-00000.csv"; }

# The CPU/MPI runs every device row is compared with, into $carry/reference (made here).
make_references() {
  local saved_backend=${backend:-} saved_work=${work:-}
  backend=cpu
  work=$(mktemp -d "${TMPDIR:-/tmp}/kilter-nccl-references.XXXXXX")
  RUNTIME_ENV=(env) MPIEXEC=${MPIEXEC:-mpirun} KILTER=$build/kilter
  [[ -d $carry/data/base ]] || make_datasets
  mkdir -p "$carry/reference"
  cd "$work" || die "cannot enter $work"
  local p id path np dataset args peer bf16=1
  run_leg probe 1 mpi $(common_args base 1) --train.backend=cpu --train.precision=bf16
  [[ $LEG_RC -eq 0 ]] || { bf16=0; say "this CPU cannot run bf16: no bf16 references (GPU bf16 rows compare with 1 GPU rank only)"; }
  for p in $(precisions); do
    [[ $p == bf16 && $bf16 -eq 0 ]] && continue
    say "CPU/MPI references, $p"
    while IFS='|' read -r id path np dataset args peer; do
      run_leg "ref-$p-$id" "$np" mpi $(common_args "$dataset") --train.backend=cpu --train.precision="$p" $args
      [[ -z $(leg_problem "ref-$p-$id" "$np" cpu "$dataset") ]] || { cat "ref-$p-$id.log"; return 1; }
      cp "$(metrics "ref-$p-$id")" "$carry/reference/$p-$id.csv"
    done < <(printf '1|1 rank|1|base|\ncut1|1 rank|1|cut|\n'; matrix_rows)
    checkpoint_legs "ref-$p" mpi --train.backend=cpu --train.precision="$p" || return 1
    cp "$(metrics "ref-$p-ckpt")" "$carry/reference/$p-ckpt-part.csv"
    cp "$(metrics "ref-$p-ckpt-resume")" "$carry/reference/$p-ckpt-resume.csv"
  done
  cd "$root" && rm -rf "$work"
  backend=$saved_backend work=$saved_work
  say "references in $carry/reference: $(ls "$carry/reference" | wc -l) runs"
}

# A sharded checkpoint written on 4 ranks (stopped after 3 steps by the SIGUSR1 drill of
# lib/train/guards.cpp: exit 85) and resumed on 2: runs/PREFIX-ckpt and runs/PREFIX-ckpt-resume
# (which gets a copy of the first, so each keeps its own metrics).
checkpoint_legs() {  # checkpoint_legs PREFIX LAUNCH [ARGS...]
  local prefix=$1 launch=$2
  shift 2
  KILTER_TEST_FAIL_RANK=1 KILTER_TEST_FAIL_STEP=2 KILTER_TEST_FAIL_MODE=sigusr1 \
    run_leg "$prefix-ckpt" 4 "$launch" $(common_args base) --comm.algo=flat --train.shard_optimizer=true "$@"
  [[ $LEG_RC -eq 85 ]] || { CKPT_PROBLEM="the 4-rank part ended with exit $LEG_RC, not 85 (stopped)"; cat "$prefix-ckpt.log"; return 1; }
  cp -r "runs/$prefix-ckpt" "runs/$prefix-ckpt-resume"
  rm -f "runs/$prefix-ckpt-resume/metrics/"*.csv
  run_leg "$prefix-ckpt-resume" 2 "$launch" $(common_args base) --comm.algo=flat --train.shard_optimizer=true "$@" \
    --resume "runs/$prefix-ckpt-resume"
  CKPT_PROBLEM=$(leg_problem "$prefix-ckpt-resume" 2 "$backend")
  if [[ -z $CKPT_PROBLEM ]] && ! grep -q "resumed from runs/$prefix-ckpt-resume/checkpoints/step-00000003.h5" "$prefix-ckpt-resume.log"; then
    CKPT_PROBLEM="the 2-rank run did not resume from the step-3 checkpoint"
  fi
  [[ -z $CKPT_PROBLEM ]] || { cat "$prefix-ckpt-resume.log"; return 1; }
}

# ---- the matrix, the drills, the table ------------------------------------------------------------
ROWS=rows.tsv

# loss_row PATH RANKS PRECISION RUN_CSVS ONE_RANK_CSVS CPU_CSVS EXPECT NOTE [PEER_CSVS]: a row of
# the table (PEER_CSVS: another multi-rank run of the same backend, "-" when none).
loss_row() {
  printf 'loss\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" "$6" "$7" "$8" "${9:--}" >>"$ROWS"
}
drill_row() { printf 'drill\t%s\t%s\t%s\t%s\n' "$@" >>"$ROWS"; }

reference() {  # reference PRECISION ID...: the CPU/MPI metrics files, comma-separated, or "-"
  local p=$1 out="" id
  shift
  for id in "$@"; do
    [[ -f $references/$p-$id.csv ]] || { echo "-"; return; }
    out+=${out:+,}$references/$p-$id.csv
  done
  echo "$out"
}

# The device check must fit 8 minutes: rows left when the budget runs low are reported, not run.
out_of_time() { [[ $SECONDS -gt $((start + ${KILTER_NCCL_BUDGET_S:-$([[ $backend == cuda ]] && echo 450 || echo 3600)} - 40)) ]]; }

run_precision() {  # run_precision PRECISION: the 1-rank runs, every row, the checkpoint
  local p=$1 id path np dataset args peer problem
  local args_of_p=(--train.backend="$backend" "${BACKEND_ARGS[@]}" --train.precision="$p")
  for id in 1 cut1; do
    dataset=base; [[ $id == cut1 ]] && dataset=cut
    say "$p: 1 rank ($dataset)"
    run_leg "$p-$id" 1 one-gpu $(common_args $dataset) "${args_of_p[@]}"
    problem=$(leg_problem "$p-$id" 1 "$backend")
    loss_row "1 rank ($dataset)" 1 "$p" "$(metrics "$p-$id")" - "$(reference "$p" "$id")" pass "$problem"
  done
  while IFS='|' read -r id path np dataset args peer; do
    if out_of_time; then loss_row "$path" "$np" "$p" - - - pass "not run: the time budget is spent"; continue; fi
    say "$p: $path on $np ranks"
    # The first multi-rank run shows NCCL's own account of its transports (see check_transport).
    [[ $id == flat2 && $p == fp32 && $backend == cuda ]] && export NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,ENV
    run_leg "$p-$id" "$np" one-gpu $(common_args "$dataset") "${args_of_p[@]}" $args
    unset NCCL_DEBUG NCCL_DEBUG_SUBSYS
    problem=$(leg_problem "$p-$id" "$np" "$backend" "$dataset")
    local one=1; [[ $dataset == cut ]] && one=cut1
    loss_row "$path" "$np" "$p" "$(metrics "$p-$id")" "$(metrics "$p-$one")" "$(reference "$p" "$id")" pass "$problem" \
      "$([[ -n $peer ]] && metrics "$p-$peer" || echo -)"
  done < <(matrix_rows)
  if out_of_time; then loss_row "checkpoint 4 -> 2 ranks, sharded" "4, 2" "$p" - - - pass "not run: the time budget is spent"; return; fi
  say "$p: a sharded checkpoint written on 4 ranks, resumed on 2"
  CKPT_PROBLEM=""
  checkpoint_legs "$p" one-gpu "${args_of_p[@]}" >/dev/null
  loss_row "checkpoint 4 -> 2 ranks, sharded" "4, 2" "$p" "$(metrics "$p-ckpt"),$(metrics "$p-ckpt-resume")" \
    "$(metrics "$p-1")" "$(reference "$p" ckpt-part ckpt-resume)" pass "$CKPT_PROBLEM"
}

# NCCL's INFO lines of the first 2-rank run: each rank its own host (NCCL_HOSTID taken, 2 nodes),
# the Socket transport on loopback, and no P2P or shared memory between the ranks.
check_transport() {
  local log=fp32-flat2.log verdict=pass detail
  local hostids sockets p2p
  hostids=$(grep -c "NCCL_HOSTID set by environment" "$log")
  sockets=$(grep -c "NET/Socket" "$log")
  p2p=$(grep -cE "via (P2P|SHM)" "$log")
  detail="NCCL_HOSTID taken by $hostids rank(s), $sockets NET/Socket lines, $p2p P2P/SHM connections"
  [[ $hostids -ge 2 && $sockets -ge 1 && $p2p -eq 0 ]] || verdict=FAIL
  grep -m1 "NCCL version" "$log" | sed 's/^/  /'
  grep -m2 "NET/Socket : Using" "$log" | sed 's/^/  /'
  drill_row "NCCL transport between the ranks" 2 "$detail" "$verdict"
}

# A fault drill on 4 ranks (the test hook of lib/train/guards.cpp on rank 1 at step 3): every
# rank must end, non-zero, within comm.timeout_s plus a margin (a coarse no-hang bound, not a
# timing), no kilter left behind, and rank 1 named by the others or by the launcher. Whether the
# others' NCCL communicators were aborted (ncclCommAbort) is counted, and on the GPU required.
drill() {  # drill MODE PATH NAME_PATTERN [MPIRUN OPTIONS [NAME KILTER ARGS...]]
  local mode=$1 path=$2 named=$3 timeout_s=10 name=drill-$1 options=${4:-}
  [[ -n ${5:-} ]] && name=drill-$5
  local extra=("${@:6}")
  local limit=$((timeout_s + 40)) t0=$SECONDS rc=0
  if out_of_time; then drill_row "$path" 4 "not run: the time budget is spent" FAIL; return; fi
  say "drill: $path"
  KILTER_TEST_FAIL_RANK=1 KILTER_TEST_FAIL_STEP=3 KILTER_TEST_FAIL_MODE=$mode KILTER_NCCL_RUN_TIMEOUT=$limit \
    LEG_MPIRUN_OPTIONS=$options run_leg "$name" 4 one-gpu $(common_args base 40 $timeout_s) --train.backend="$backend" "${BACKEND_ARGS[@]}" \
    --train.precision=fp32 "${extra[@]}"
  rc=$LEG_RC
  local seconds=$((SECONDS - t0)) problems=() aborts
  [[ $rc -ne 0 ]] || problems+=("the job exited 0")
  [[ $rc -ne 124 ]] || problems+=("ranks still running after $limit s")
  pgrep -f "output.dir=runs/$name" >/dev/null && problems+=("kilter processes left behind")
  grep -qE -- "$named" "$name.log" || problems+=("rank 1 not named ('$named')")
  # The communicators' own error path says "communicator aborted"; the watchdog, before it ends a
  # stuck job, "N NCCL communicator(s) aborted (ncclCommAbort)" (lib/comm/abort_hooks.h).
  aborts=$(grep -cE "communicator aborted|NCCL communicator\(s\) aborted" "$name.log" || true)
  [[ $backend != cuda || $aborts -gt 0 ]] || problems+=("no rank ended through ncclCommAbort")
  local detail="ended after $seconds s (limit $limit, exit $rc); ncclCommAbort on $aborts rank(s); $(grep -m1 -oE -- "($named).{0,60}" "$name.log" | head -1)"
  grep -m3 -E "communicator aborted|communicator\(s\) aborted|ranks not arrived|Process name|exited" "$name.log" | cut -c1-200 | sed 's/^/  /'
  if [[ ${#problems[@]} -eq 0 ]]; then drill_row "$path" 4 "$detail" pass
  else drill_row "$path" 4 "$detail" "FAIL: $(IFS=';'; echo "${problems[*]}")"; fi
}

# The CPU rehearsal's control: a copy of a run with its losses off by 5e-5 must fail the table.
control_row() {
  awk -F, 'BEGIN {OFS = ","} NR == 1 {for (i = 1; i <= NF; i++) if ($i == "loss") c = i; print; next}
           {$c = sprintf("%.8f", $c * (1 + 5e-5)); print}' "$(metrics fp32-flat2)" > control.csv
  loss_row "control: flat 2 with losses off by 5e-5" 2 fp32 control.csv "$(metrics fp32-1)" - fail ""
}

# kilter_gpu_nccl_test on 2 and 4 ranks of the one GPU: allreduce, reduce-scatter, all-gather
# and broadcast of integer-valued f32/f64/i64 data through the NCCL communicator, exact sums.
# Returns non-zero when NCCL does not work here at all (2 ranks failed): the training runs would
# only fail the same way, slower, so the check stops there (with NCCL's INFO log of that run).
collectives() {
  local test_binary=${KILTER%/*}/kilter_gpu_nccl_test np rc
  [[ -x $test_binary ]] || { drill_row "NCCL collectives (kilter_gpu_nccl_test)" - "not carried" FAIL; return 0; }
  for np in 2 4; do
    say "kilter_gpu_nccl_test on $np ranks"
    rc=0
    [[ $np -eq 2 ]] && export NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,ENV
    timeout 90 "${RUNTIME_ENV[@]}" MPIEXEC="$MPIEXEC" bash "$root/tests/gpu/ranks-on-one-gpu.sh" "$np" -- \
      "$test_binary" --gtest_filter='NcclCommunicator.*' </dev/null >"collectives-$np.log" 2>&1 || rc=$?
    unset NCCL_DEBUG NCCL_DEBUG_SUBSYS
    grep -E "NCCL [0-9]|failure|FAIL|SKIPPED|NCCL WARN" "collectives-$np.log" | head -8 | cut -c1-200 | sed 's/^/  /'
    if [[ $rc -eq 0 ]] && grep -q "kilter_gpu_nccl_test: 0 failure(s)" "collectives-$np.log"; then
      drill_row "NCCL collectives (kilter_gpu_nccl_test)" "$np" "exact sums of f32, f64, i64" pass
    else
      drill_row "NCCL collectives (kilter_gpu_nccl_test)" "$np" "exit $rc (collectives-$np.log)" FAIL
      if [[ $np -eq 2 ]]; then
        tail -30 "collectives-$np.log"
        loss_row "training runs" - fp32 - - - pass "not run: NCCL failed on 2 ranks (collectives-2.log)"
        return 1
      fi
    fi
  done
  param_shards_collectives
}

# The same binary's parameter shards (train.shard = parameters) on 2 and 4 ranks: each unit
# all-gathered whole and gathered again after its release, gradients reduce-scattered and accumulated over two
# micro-batches, on 4 ranks also in groups of 2 (HSDP). A failure is a row, not the end: the other
# paths still run. Each test must be seen passing by name (an older binary without them fails).
param_shards_collectives() {
  local test_binary=${KILTER%/*}/kilter_gpu_nccl_test np rc tests missing
  # First the device pages they rest on: a unit backed, written through a kernel, given back, the
  # chunk intact, the memory returned (cudaMemGetInfo); it prints the device's granularity.
  local vmm=${KILTER%/*}/kilter_gpu_vmm_test
  rc=0
  timeout 60 "${RUNTIME_ENV[@]}" "$vmm" </dev/null >vmm.log 2>&1 || rc=$?
  grep -E "granularity|free:|OK|FAIL|Failure|SKIPPED" vmm.log | head -8 | cut -c1-200 | sed 's/^/  /'
  if [[ $rc -eq 0 ]] && grep -q "PASSED .* 2 tests" vmm.log; then
    drill_row "sparse device buffers (kilter_gpu_vmm_test)" 1 "backed, written, given back" pass
  else
    drill_row "sparse device buffers (kilter_gpu_vmm_test)" 1 "exit $rc (vmm.log)" FAIL
    tail -20 vmm.log
  fi
  # The CUDA model under parameters with bf16 storage, one rank's view without NCCL: a holder that
  # gathers the working copy alone against the distributed optimizer gathered whole.
  local dopt=${KILTER%/*}/kilter_gpu_distributed_optimizer_test unit_wise=UnitWiseWorkingCopyAgainstTheWholeGather
  rc=0
  timeout 120 "${RUNTIME_ENV[@]}" "$dopt" --gtest_filter="DistributedOptimizer.$unit_wise" </dev/null \
    >unit-wise.log 2>&1 || rc=$?
  grep -E "FAIL|Failure|SKIPPED" unit-wise.log | head -8 | cut -c1-200 | sed 's/^/  /'
  if [[ $rc -eq 0 ]] && grep -qE "^\[ +OK \] DistributedOptimizer\.$unit_wise " unit-wise.log; then
    drill_row "bf16 working copy gathered unit by unit (kilter_gpu_distributed_optimizer_test)" 1 \
      "losses, gradients, master against the whole gather" pass
  else
    drill_row "bf16 working copy gathered unit by unit (kilter_gpu_distributed_optimizer_test)" 1 \
      "exit $rc, not passed (unit-wise.log)" FAIL
    tail -20 unit-wise.log
  fi
  for np in 2 4; do
    say "kilter_gpu_nccl_test (parameter shards) on $np ranks"
    rc=0
    timeout 90 "${RUNTIME_ENV[@]}" MPIEXEC="$MPIEXEC" bash "$root/tests/gpu/ranks-on-one-gpu.sh" "$np" -- \
      "$test_binary" --gtest_filter='NcclParamShards.*' </dev/null >"param-shards-$np.log" 2>&1 || rc=$?
    grep -E "ok |FAIL|failure|SKIPPED|NCCL WARN" "param-shards-$np.log" | head -8 | cut -c1-200 | sed 's/^/  /'
    tests=(GatherAndReduceScatterOverTheWorld WorkingCopyGatheredAlone)
    [[ $np -eq 4 ]] && tests+=(GroupsOfTwoAcrossReplicas)
    missing=""
    for t in "${tests[@]}"; do
      grep -qE "^\[ +OK \] NcclParamShards\.$t " "param-shards-$np.log" || missing+=" $t"
    done
    if [[ $rc -eq 0 && -z $missing ]] && grep -q "kilter_gpu_nccl_test: 0 failure(s)" "param-shards-$np.log"; then
      drill_row "NCCL parameter shards (kilter_gpu_nccl_test)" "$np" "exact gathers and reduce-scatters" pass
    else
      drill_row "NCCL parameter shards (kilter_gpu_nccl_test)" "$np" \
        "exit $rc, not passed:${missing:- see log} (param-shards-$np.log)" FAIL
      tail -20 "param-shards-$np.log"
    fi
  done
}

drills() {
  # Rank 1 dies (exit 3) at the start of step 3 while the others compute and reduce step 3. The
  # launcher is told not to end the job for it (as srun does by default, --kill-on-bad-exit=0), so
  # the others must notice on their own: NCCL's error on the closed sockets, or the watchdog.
  drill exit "fault: rank 1 dies mid-reduction" \
    "ranks not arrived: 1 \\(|process rank 1 |Process name: \\[\\[[0-9]+,[0-9]+\\],1\\]" \
    "--mca orte_abort_on_non_zero_status 0"
  # Rank 1 stops taking part: the others' watchdogs name it after comm.timeout_s.
  drill hang "fault: rank 1 stalls" "ranks not arrived: 1 \\("
  # The same under train.shard = parameters: the others wait for the unit gathers and
  # reduce-scatters of the pass (the watchdog's section names them) and name rank 1.
  drill hang "fault: rank 1 stalls, parameters" \
    "(parameter all-gather|gradient reduce-scatter|across the shard groups).*ranks not arrived: 1 \\(" \
    "" hang-parameters $PARAMETERS_ARGS
}

run_matrix() {
  cd "$work" || die "cannot enter $work"
  : >"$ROWS"
  say "runs in $work (backend $backend, mpirun $MPIEXEC)"
  local p nccl_works=1
  [[ $backend == cuda ]] && { collectives || nccl_works=0; }
  if [[ $nccl_works -eq 1 ]]; then
    # fp32 first, then the drills, then bf16: what matters most runs first should time run short.
    for p in $(precisions); do
      run_precision "$p"
      [[ $p == fp32 ]] && drills
    done
    [[ $backend == cuda ]] && check_transport
    [[ $backend == cpu ]] && control_row
  fi
  echo
  python3 "$root/tests/gpu/nccl_compare.py" "$ROWS" | tee table.txt
  local rc=${PIPESTATUS[0]}
  if [[ -n ${OUT:-} && -d ${OUT:-} ]]; then
    mkdir -p "$OUT/nccl-check"
    cp ./*.log table.txt "$ROWS" "$OUT/nccl-check/" 2>/dev/null
    find runs -name 'rank-*.csv' -exec cp --parents {} "$OUT/nccl-check/" \; 2>/dev/null
  fi
  rm -rf "$work/runtime"
  say "done (logs in $work)"
  return "$rc"
}

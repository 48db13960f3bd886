#!/usr/bin/env bash
# Installs the Debian packages kilter needs to build, test and run its demo.
# Idempotent: packages already present are skipped; apt-get runs only when something is missing.
# Usage: scripts/install-deps.sh [--with-test-extras]   (torch/h5py/chromium/slurm/lmod, the
# tokenizer oracles python3-sentencepiece and HF `tokenizers` from PyPI, clang for the fuzz
# harnesses, TensorBoard's event reader, for tests)
# Apache Arrow's C++ Parquet reader (kilter prep --format parquet) comes from PyPI's pyarrow wheel
# in a venv of its own (/opt/kilter/pyarrow-venv; KILTER_PYARROW_VENV); KILTER_NO_PARQUET=1 skips it.
set -euo pipefail

BUILD_PKGS=(build-essential cmake pkg-config git
  openmpi-bin libopenmpi-dev
  libhdf5-dev hdf5-tools
  libboost-program-options-dev
  libopenblas-dev libdnnl-dev
  libgtest-dev googletest
  nlohmann-json3-dev libfmt-dev
  libsentencepiece-dev libpcre2-dev libicu-dev
  zlib1g-dev libzstd-dev
  python3 python3-venv
  fortunes fortunes-min)
TEST_PKGS=(python3 python3-numpy python3-h5py python3-torch python3-sentencepiece python3-pip python3-venv
  chromium
  slurm-wlm munge lmod
  iproute2 util-linux mount
  procps
  clang libclang-rt-14-dev)  # libFuzzer + ASan/UBSan runtimes for the fuzz harnesses (bench/fuzz.sh)

want=("${BUILD_PKGS[@]}")
if [[ "${1:-}" == "--with-test-extras" ]]; then want+=("${TEST_PKGS[@]}"); fi

missing=()
for p in "${want[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
if (( ${#missing[@]} == 0 )); then
  echo "install-deps: all ${#want[@]} packages present"
else
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  echo "install-deps: done"
fi

# HF `tokenizers` (the exact-match oracle of tests/e2e/tokenizer_exact.sh) is not packaged by
# Debian: pip installs it for the Debian python the tests use, only when it is missing.
if [[ "${1:-}" == "--with-test-extras" ]]; then
  PY=${KILTER_PYTHON:-/usr/bin/python3}
  TOKENIZERS_VERSION=${KILTER_TOKENIZERS_VERSION:-0.23.3}
  if "$PY" -c "import tokenizers" 2>/dev/null; then
    echo "install-deps: python tokenizers present"
  else
    echo "install-deps: pip installing tokenizers==$TOKENIZERS_VERSION for $PY"
    $SUDO "$PY" -m pip install -q --disable-pip-version-check --root-user-action=ignore \
      --break-system-packages "tokenizers==$TOKENIZERS_VERSION"
  fi
fi

# Hugging Face `transformers` and `safetensors` (the oracles of the HF export/import tests,
# tests/e2e/hf_export.sh and hf_import.sh) in a test-only virtual environment that also sees
# Debian's python3-torch (1.13): transformers 4.44 still supports torch 1.x, and it pins
# tokenizers < 0.20, so it lives apart from the system python's tokenizers 0.23 above.
if [[ "${1:-}" == "--with-test-extras" ]]; then
  HF_VENV=${KILTER_HF_VENV:-/opt/kilter-test-venv}
  TRANSFORMERS_VERSION=${KILTER_TRANSFORMERS_VERSION:-4.44.2}
  SAFETENSORS_VERSION=${KILTER_SAFETENSORS_VERSION:-0.4.5}
  if "$HF_VENV/bin/python" -c "import transformers, safetensors, torch" 2>/dev/null; then
    echo "install-deps: $HF_VENV has transformers and safetensors"
  else
    echo "install-deps: pip installing transformers==$TRANSFORMERS_VERSION safetensors==$SAFETENSORS_VERSION into $HF_VENV"
    $SUDO "${KILTER_PYTHON:-/usr/bin/python3}" -m venv --system-site-packages "$HF_VENV"
    $SUDO "$HF_VENV/bin/python" -m pip install -q --disable-pip-version-check \
      "transformers==$TRANSFORMERS_VERSION" "safetensors==$SAFETENSORS_VERSION"
  fi
fi

# Apache Arrow's C++ Parquet reader (io/parquet_input.cpp, found by cmake/KilterParquet.cmake):
# Debian does not package Arrow; PyPI's pyarrow wheel ships its headers and libarrow/libparquet.
# It goes into a venv of its own, without Debian's site packages: its Python side needs NumPy 2,
# while Debian's h5py and torch are built against NumPy 1. create_library_symlinks() makes the
# unversioned libarrow.so/libparquet.so a linker wants. With --with-test-extras the same venv gets
# the test oracles that need a newer stack than Debian's: TensorBoard's event reader
# (tests/e2e/tensorboard.sh) and HF tokenizers for the Parquet tests and bench/prep_parquet.sh.
if [[ "${KILTER_NO_PARQUET:-0}" != "1" ]]; then
  PA_VENV=${KILTER_PYARROW_VENV:-/opt/kilter/pyarrow-venv}
  PYARROW_VERSION=${KILTER_PYARROW_VERSION:-26.0.1}
  NUMPY_VERSION=${KILTER_PYARROW_NUMPY_VERSION:-2.4.6}
  if "$PA_VENV/bin/python" -c "import pyarrow, sys; sys.exit(pyarrow.__version__ != '$PYARROW_VERSION')" 2>/dev/null; then
    echo "install-deps: pyarrow $PYARROW_VERSION present in $PA_VENV"
  else
    echo "install-deps: pip installing pyarrow==$PYARROW_VERSION numpy==$NUMPY_VERSION into $PA_VENV"
    $SUDO mkdir -p "$(dirname "$PA_VENV")"
    $SUDO "${KILTER_PYTHON:-/usr/bin/python3}" -m venv "$PA_VENV"
    $SUDO "$PA_VENV/bin/python" -m pip install -q --disable-pip-version-check \
      "pyarrow==$PYARROW_VERSION" "numpy==$NUMPY_VERSION"
  fi
  $SUDO "$PA_VENV/bin/python" -c "import pyarrow; pyarrow.create_library_symlinks()"
  if [[ "${1:-}" == "--with-test-extras" ]]; then
    TENSORBOARD_VERSION=${KILTER_TENSORBOARD_VERSION:-2.20.0}
    PA_TOKENIZERS_VERSION=${KILTER_TOKENIZERS_VERSION:-0.23.3}
    if "$PA_VENV/bin/python" -c "import tensorboard, tokenizers" 2>/dev/null; then
      echo "install-deps: $PA_VENV has tensorboard and tokenizers"
    else
      echo "install-deps: pip installing tensorboard==$TENSORBOARD_VERSION tokenizers==$PA_TOKENIZERS_VERSION into $PA_VENV"
      $SUDO "$PA_VENV/bin/python" -m pip install -q --disable-pip-version-check \
        "tensorboard==$TENSORBOARD_VERSION" "tokenizers==$PA_TOKENIZERS_VERSION"
    fi
  fi
fi

# cudnn-frontend's header-only C++ API (the cuDNN SDPA flash-attention engine,
# lib/model/attention_sdpa.cu) where the CUDA toolkit is present. Debian does not package it; PyPI's
# `nvidia-cudnn-frontend` wheel ships the headers under include/ (its Python dependencies serve
# its Python API only: --no-deps). The wheel is downloaded, not installed, and its include/ goes
# into a folder this script owns, which CMake searches (cmake/KilterCudnn.cmake); the version is
# pinned and recorded in that folder, so a second run with the same version does nothing.
CUDA_NVCC=${KILTER_CUDA_NVCC:-/usr/local/cuda/bin/nvcc}
if [[ -x "$CUDA_NVCC" ]] || command -v nvcc >/dev/null; then
  CFE_VERSION=${KILTER_CUDNN_FRONTEND_VERSION:-1.32.0}
  CFE_ROOT=${KILTER_CUDNN_FRONTEND_ROOT:-/opt/kilter/cudnn-frontend}
  if [[ -f "$CFE_ROOT/include/cudnn_frontend.h" && "$(cat "$CFE_ROOT/VERSION" 2>/dev/null)" == "$CFE_VERSION" ]]; then
    echo "install-deps: cudnn-frontend $CFE_VERSION headers present in $CFE_ROOT/include"
  else
    echo "install-deps: cudnn-frontend $CFE_VERSION headers (PyPI nvidia-cudnn-frontend) into $CFE_ROOT/include"
    PY=${KILTER_PYTHON:-/usr/bin/python3}
    if ! "$PY" -m pip --version >/dev/null 2>&1; then
      $SUDO apt-get install -y -qq --no-install-recommends python3-pip >/dev/null
    fi
    cfe_tmp=$(mktemp -d)
    trap 'rm -rf "$cfe_tmp"' EXIT
    # Any wheel of the release carries the same headers: ask for the CPython 3.11 one of this
    # architecture whatever the local python is.
    "$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
      --python-version 3.11 --platform "manylinux_2_28_$(uname -m)" \
      "nvidia-cudnn-frontend==$CFE_VERSION" -d "$cfe_tmp"
    "$PY" - "$cfe_tmp" <<'PY'
import glob, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/nvidia_cudnn_frontend-*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    members = [m for m in z.namelist() if m.startswith("include/")]
    z.extractall(sys.argv[1] + "/unpacked", members)
PY
    [[ -f "$cfe_tmp/unpacked/include/cudnn_frontend.h" ]] || { echo "install-deps: the wheel has no include/cudnn_frontend.h" >&2; exit 1; }
    $SUDO mkdir -p "$CFE_ROOT"
    $SUDO rm -rf "$CFE_ROOT/include"
    $SUDO cp -r "$cfe_tmp/unpacked/include" "$CFE_ROOT/include"
    echo "$CFE_VERSION" | $SUDO tee "$CFE_ROOT/VERSION" >/dev/null
    echo "install-deps: done ($CFE_ROOT/include)"
  fi
fi

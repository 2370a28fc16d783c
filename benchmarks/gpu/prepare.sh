#!/usr/bin/env bash
# Fill the git-ignored .gpu/ with what the GPU machine cannot download (benchmarks/gpu/README.md): the transformers
# wheel (and regex, whose version it checks at import), and bitsandbytes unpacked with only its CUDA 13.0 and CPU
# libraries. Run here, where the registry is.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
TRANSFORMERS=5.23.0
BITSANDBYTES=0.50.2
REGEX=2026.11.19  # transformers 5.23 refuses to import with a regex older than 2025.10.22
CUDA_LIBRARY=libbitsandbytes_cuda130.so  # torch 2.11+cu130 there: bitsandbytes picks it from torch.version.cuda
LIMIT_MIB=60

rm -rf .gpu
mkdir -p .gpu/download
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux2014_x86_64 \
    -d .gpu/download "transformers==$TRANSFORMERS" "bitsandbytes==$BITSANDBYTES" "regex==$REGEX"
mv .gpu/download/transformers-"$TRANSFORMERS"-*.whl .gpu/download/regex-"$REGEX"-*.whl .gpu/
"$PY" - "$CUDA_LIBRARY" .gpu/download/bitsandbytes-"$BITSANDBYTES"-*.whl <<'EOF'
import sys
import zipfile

keep, wheel = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as archive:
    names = [n for n in archive.namelist() if not n.endswith(".so") or n.endswith((keep, "_cpu.so"))]
    archive.extractall(".gpu/bitsandbytes-site", names)
print(f"bitsandbytes: kept {len(names)} files, libraries:", *sorted(n for n in names if n.endswith(".so")))
EOF
rm -rf .gpu/download

tracked=$(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1)
untracked=$(git ls-files -z --others --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
kit=$(du -sb .gpu | cut -f1)
total=$(( tracked + ${untracked:-0} + kit ))
mib() { echo "$(( $1 / 1048576 )).$(( ($1 % 1048576) * 10 / 1048576 )) MiB"; }
echo "tracked tree $(mib "$tracked"), untracked (not ignored) $(mib "${untracked:-0}"), .gpu $(mib "$kit"):" \
     "$(mib "$total") of at most $LIMIT_MIB MiB"
du -sh .gpu/* | sed 's/^/  /'
if [ "$total" -ge $(( LIMIT_MIB * 1048576 )) ]; then
    echo "prepare: working tree + .gpu exceed $LIMIT_MIB MiB: the device call would not carry them" >&2
    exit 1
fi

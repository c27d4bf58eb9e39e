#!/usr/bin/env bash
# google-tunix 0.1.7 for the GPU machine (Python 3.12, jax 0.11.2, no network): the wheels its image lacks, into
# .whl/ (git-ignored, 20 MB), for bench/bench_peers.py's GPU run (docs/performance.md "A peer side by side").
# The pins are tunix's dependency closure resolved against jax==0.11.2 for CPython 3.12 manylinux (pip install
# --dry-run --python-version 3.12 --only-binary=:all: google-tunix==0.1.7 jax==0.11.2): it keeps jax 0.11.2,
# and these are the packages of that closure the image does not have. safetensors<0.8 (tunix's pin) is left
# out: the image's 0.8 is not replaced, and nothing on the GRPO path checks the pin.
# On the machine, before the bench: python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir
#   --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
set -euo pipefail
cd "$(dirname "$0")/.."
exclude="$(git rev-parse --git-common-dir)/info/exclude"
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >> "$exclude"
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
  manylinux2014_x86_64 manylinux1_x86_64; do platforms+=(--platform "$p"); done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" -d .whl \
  google-tunix==0.1.7 google_metrax==0.2.4 qwix==0.1.8 datasets==5.2.0 grain==0.2.18 hf_transfer==0.1.9 \
  importlib_resources==7.1.0 kagglehub==1.0.3 omegaconf==2.4.0 perfetto==0.59.1 python-dotenv==1.2.4 \
  tenacity==9.2.1 tensorflow-datasets==4.9.10 array_record==0.8.6 clu==0.0.12 dill==0.4.1 kagglesdk==0.1.38 \
  multiprocess==0.70.19 tensorboardX==2.6.5 dm-tree==0.1.10 immutabledict==4.3.1 portpicker==1.6.0 \
  simple-parsing==0.1.9 tensorflow-metadata==1.21.0 termcolor==3.3.0 toml==0.10.2 docstring_parser==0.18.0 \
  googleapis-common-protos==1.76.0 pydantic==2.14.4 pydantic_core==2.50.5 ml_collections==1.1.0 \
  annotated-types==0.8.0 typing-inspection==0.4.5 tzdata==2026.6
# Two pure-Python dependencies ship only as source: built here into wheels (py3-none-any).
python3 -m pip wheel -q --no-deps -w .whl promise==2.3 pylatexenc==2.11
ls .whl | wc -l
du -sh .whl

#!/usr/bin/env bash
# Builds the folder benchmarks/gpu.sh carries to a device machine (Python 3.12, no registry):
# the cp312 wheels it lacks unpacked into PEERS/site, and the CleanRL and PureJaxRL checkouts
# it times beside jaxwm, cut to the files it runs (their git HEAD kept, so results name the
# peer's commit). About 50 MB, under the device call's 64 MiB with the repository.
#
#   bash benchmarks/peers/gpu_carry.sh CLEANRL_CHECKOUT PUREJAXRL_CHECKOUT [PEERS]
#
# PEERS defaults to .peers, which this adds to .git/info/exclude (never commit it). Then, with
# a device lent: run `bash benchmarks/gpu.sh throughput; bash benchmarks/gpu.sh learning` with
# carry [".peers"] and JAXWM_COMMIT set to the commit measured.
set -euo pipefail
cleanrl=${1:?"a CleanRL checkout"}; purejaxrl=${2:?"a PureJaxRL checkout"}; peers=${3:-.peers}
grep -qx "/$peers/" .git/info/exclude 2>/dev/null || echo "/$peers/" >> .git/info/exclude
wheels=$(mktemp -d)
platforms="--platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform any"
# envpool 1.2.5 and gymnasium as jaxwm pins them; gymnax < 0.12-jax; tfp-nightly: distrax's
# own requirement (tensorflow-probability 0.25 fails on jax >= 0.10's xla module); gym 0.26.2
# (CleanRL imports it) is published only as source, so its wheel is built here.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  $platforms -d "$wheels" envpool==1.2.5 envpool-assets==0.3.0 gymnasium==1.3.0 farama-notifications \
  ml-collections tensorboardX evosax==0.3.2 dotmap gymnax==1.0.1 distrax tfp-nightly dm-tree==0.1.10 \
  gast decorator tyro docstring-parser shtab typeguard gym-notices
python3 -m pip wheel -q --no-deps gym==0.26.2 -w "$wheels"
rm -rf "$peers" && mkdir -p "$peers/site"
for w in "$wheels"/*.whl; do (cd "$peers/site" && unzip -q -o "$w"); done
rm -rf "$wheels"
cd "$peers/site"
# envpool and its assets, whole, are over the carry limit: keep the families the GPU rows use
for family in box2d gfootball highway jumanji minigrid mujoco pgx procgen toy_text vizdoom; do
  rm -rf "envpool/$family" "envpool_assets/$family"
done
python3 - <<'EOF'
import re
path = "envpool/entry.py"
text = open(path).read()
open(path, "w").write(re.sub(r"^(import envpool\.(?!atari|classic_control)\S+)", r"# \1", text,
                             flags=re.M))
EOF
rm -rf tensorflow_probability/substrates/numpy  # distrax uses the jax substrate
find . -name __pycache__ -prune -exec rm -rf {} +
cd - >/dev/null
copy() {  # a checkout cut to the files named, its git HEAD kept for the results' notes
  git clone -q --depth 1 "file://$(cd "$1" && pwd)" "$peers/$2"
  (cd "$peers/$2" && find . -path ./.git -prune -o -type f -print | grep -v -x -F "$(printf './%s\n' "${@:3}")" \
     | xargs rm -f && rm -rf .git/objects/pack)
}
copy "$cleanrl" cleanrl cleanrl/ppo_atari_envpool_xla_jax_scan.py
copy "$purejaxrl" purejaxrl purejaxrl/ppo.py purejaxrl/wrappers.py
du -sh "$peers"

#!/usr/bin/env bash
# The GPU measurements of BENCHMARKS.md in one command: memory model, OOM guard, training at
# capacity, training throughput. Each part fits one 10-minute call of a lent H100/H200.
#
#   bash bench/gpu_suite.sh memory [OUT]   # calibrate a ~110M-parameter LM in bf16, predicted vs
#                                          # measured peaks, a real OOM recovered by OOMGuard,
#                                          # an epoch (<= 150 steps) at the calibrated budget (bench/memory_gpu.py)
#   bash bench/gpu_suite.sh train  [OUT]   # tokens/s of fixed / padded / packed batches, same model
#                                          # and data (bench/train.py --device cuda --dtype bf16)
#   bash bench/gpu_suite.sh ttq    [OUT]   # time to a target held-out loss: fixed vs padded / packed
#                                          # budgets, and at equal tokens per step
#                                          # (bench/time_to_quality.py; 25M model; ~5 minutes)
#   bash bench/gpu_suite.sh all    [OUT]
#   bash bench/gpu_suite.sh smoke  [OUT]   # the CUDA code paths of the three parts at tiny sizes (~2 min)
#   bash bench/gpu_suite.sh dry-run [OUT]  # the same code paths on CPU with tiny sizes (~2 min)
#
# Round 2 (issue #42): three parts that fit ONE call of at most 10 minutes together (each has
# its own timeout: 260 + 130 + 190 s), leaving room in a 15-minute session for a rerun of one.
#
#   bash bench/gpu_suite.sh shapes   [OUT]  # bounded shapes under CUDA graphs: eager, compile
#                                           # mode="reduce-overhead" unbounded and max_shapes=4/8/16,
#                                           # dynamic=True; compiles, compile s, steady tok/s, epoch 1
#                                           # incl. compiling (bench/shapes.py --suite round2; <= 260 s)
#   bash bench/gpu_suite.sh workload [OUT]  # fwd+bwd time of packed/padded micro-batches vs a*L + b*L^2
#                                           # and the default 24576*L + L^2; step efficiency of W=8
#                                           # simulated ranks (bench/workload.py; <= 130 s)
#   bash bench/gpu_suite.sh longctx  [OUT]  # calibrate up to 32k tokens, packed (sum cost) and padded:
#                                           # held-out peaks (5 %), an epoch at >= 90 % with 0 OOM
#                                           # (bench/longctx_gpu.py; <= 190 s)
#   bash bench/gpu_suite.sh round2   [OUT]  # the three, in that order (<= 10 minutes)
#   bash bench/gpu_suite.sh round2-dry-run [OUT]  # the three on CPU at tiny sizes (a dry run;
#                                           # 5-8 minutes on the loaded 2-core VM)
#
# PYTHON (default python3) names the interpreter; fitbatch is taken from src/ when it is not
# installed, so a bare GPU image with torch runs the suite without an install step.
#
# OUT (default: gpu_results/) receives one JSON file per part and the printed tables (*.txt).
# Results of the 2026-11-23 H100 run: bench/results/gpu_h100_2026-11-23/ (BENCHMARKS.md).
set -uo pipefail
cd "$(dirname "$0")/.."
part="${1:-all}"
out="${2:-gpu_results}"
mkdir -p "$out"
py="${PYTHON:-python3}"
if ! "$py" -c "import fitbatch" 2>/dev/null; then export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"; fi
export PYTHONUNBUFFERED=1

gpu_memory() {
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/device.txt"
  # capacity: 90 % of the device, enforced on the allocator by memory_gpu.py
  total_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
  capacity_gib=$(( total_mib * 90 / 100 / 1024 ))
  timeout 590 "$py" bench/memory_gpu.py --device cuda --model-size 100M --capacity "${capacity_gib}GiB" \
    --steps 150 --time-limit 240 --out "$out/memory.json" | tee "$out/memory.txt"
}

gpu_train() {
  timeout 590 "$py" bench/train.py --device cuda --dtype bf16 --model-size 100M --max-len 2048 \
    --budget 65536 --tokens 5000000 --modes fixed,padded,packed,padding-free --out "$out/train.json" | tee "$out/train.txt"
}

gpu_ttq() {
  # one call of ~5 minutes on an H100 (2026-11-23: 260 s): the best rate of a 3-rate sweep run there
  # (1e-3; 4M tokens per run did not fit 590 s), sqrt rule, equal tokens/step, one middle budget
  timeout 590 "$py" bench/time_to_quality.py --device cuda --dtype bf16 --model-size 25M --max-len 2048 \
    --budget 65536 --tokens 2000000 --files 400 --vocab 8192 --threads 4 --lr-sweep 1e-3 --lr-rules sqrt \
    --extra-budgets 16384 --eval-every 100000 --eval-tokens 32768 --time-cap 70 \
    --out "$out/time_to_quality_gpu" | tee "$out/time_to_quality_gpu.txt"
}

smoke() {
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/device.txt"
  "$py" -c "import sys, numpy, torch, fitbatch; print(sys.version.split()[0], 'numpy', numpy.__version__, 'torch', torch.__version__, 'fitbatch', fitbatch.__version__)" | tee -a "$out/device.txt"
  timeout 200 "$py" bench/memory_gpu.py --device cuda --tiny --capacity 1GiB --out "$out/memory_smoke.json" | tee "$out/memory_smoke.txt"
  timeout 150 "$py" bench/train.py --device cuda --dtype bf16 --model-size tiny --max-len 128 --budget 1024 \
    --tokens 4000 --files 20 --vocab 512 --threads 1 --modes fixed,padded,packed,padding-free \
    --out "$out/train_smoke.json" | tee "$out/train_smoke.txt"
  timeout 150 "$py" bench/time_to_quality.py --device cuda --dtype bf16 --model-size tiny --max-len 128 \
    --budget 1024 --tokens 6000 --files 20 --vocab 512 --threads 1 --lr-sweep 3e-3,1e-2 --extra-budgets 512 \
    --eval-every 1000 --eval-tokens 1000 --out "$out/ttq_smoke" | tee "$out/ttq_smoke.txt"
}

dry_run() {
  "$py" bench/memory_gpu.py --device cpu --tiny --out "$out/memory_dry.json" | tee "$out/memory_dry.txt"
  "$py" bench/train.py --device cpu --model-size tiny --max-len 128 --budget 1024 --tokens 4000 \
    --files 20 --vocab 512 --threads 1 --modes fixed,padded,packed --out "$out/train_dry.json" | tee "$out/train_dry.txt"
  "$py" bench/time_to_quality.py --device cpu --model-size tiny --max-len 128 --budget 1024 --tokens 6000 \
    --files 20 --vocab 512 --threads 1 --lr-sweep 3e-3,1e-2 --extra-budgets 512 --eval-every 1000 \
    --eval-tokens 1000 --out "$out/time_to_quality_dry" | tee "$out/time_to_quality_dry.txt"
}

device_info() {
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/device.txt"
  "$py" -c "import sys, numpy, torch, fitbatch; print(sys.version.split()[0], 'numpy', numpy.__version__, 'torch', torch.__version__, 'fitbatch', fitbatch.__version__)" | tee -a "$out/device.txt"
}

gpu_shapes() {
  # 2,500 real function lengths (<= 512), budget 4,096 padded tokens: ~51 shapes unbounded; a
  # training step of the examples' small LM (~3 M parameters) in bf16; every mode in a fresh
  # process, 30 s of epoch 1 at most (then stopped and estimated), 6 modes
  timeout 260 "$py" bench/shapes.py --suite round2 --device cuda --model lm --model-size small --train \
    --dtype bf16 --samples 2500 --budget 4096 --max-len 512 --ks 4 8 16 --time-cap 30 --threads 4 \
    --out "$out/shapes.json" | tee "$out/shapes.txt"
}

gpu_workload() {
  timeout 130 "$py" bench/workload.py --device cuda --dtype bf16 --model-size 100M --vocab 16384 \
    --max-len 8192 --caps 8192 32768 --mixed 8 --repeats 3 --ranks 8 --per-rank 2 --steps 2 \
    --time-limit 50 --out "$out/workload.json" | tee "$out/workload.txt"
}

gpu_longctx() {
  timeout 190 "$py" bench/longctx_gpu.py --device cuda --capacity 24GiB --max-len 32768 \
    --time-limit 45 --held-out 12 --steps 100 --out "$out/longctx.json" | tee "$out/longctx.txt"
}

round2_dry_run() {
  "$py" bench/shapes.py --suite round2 --device cpu --model lm --model-size tiny --train --backend aot_eager \
    --samples 120 --budget 1024 --max-len 128 --ks 4 8 --time-cap 10 --out "$out/shapes_dry.json" \
    | tee "$out/shapes_dry.txt"
  "$py" bench/workload.py --device cpu --tiny --out "$out/workload_dry.json" | tee "$out/workload_dry.txt"
  "$py" bench/longctx_gpu.py --device cpu --tiny --out "$out/longctx_dry.json" 2>/dev/null | tee "$out/longctx_dry.txt"
}

case "$part" in
  memory) gpu_memory ;;
  train) gpu_train ;;
  ttq) gpu_ttq ;;
  all) gpu_memory; gpu_train; gpu_ttq ;;
  smoke) smoke ;;
  dry-run) dry_run ;;
  shapes) device_info; gpu_shapes ;;
  workload) device_info; gpu_workload ;;
  longctx) device_info; gpu_longctx ;;
  round2) device_info; gpu_shapes; gpu_workload; gpu_longctx ;;
  round2-dry-run) round2_dry_run ;;
  *) echo "usage: bash bench/gpu_suite.sh memory|train|ttq|all|smoke|dry-run|shapes|workload|longctx|round2|round2-dry-run [OUT]" >&2; exit 2 ;;
esac

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

case "$part" in
  memory) gpu_memory ;;
  train) gpu_train ;;
  ttq) gpu_ttq ;;
  all) gpu_memory; gpu_train; gpu_ttq ;;
  smoke) smoke ;;
  dry-run) dry_run ;;
  *) echo "usage: bash bench/gpu_suite.sh memory|train|ttq|all|smoke|dry-run [OUT]" >&2; exit 2 ;;
esac

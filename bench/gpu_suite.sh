#!/usr/bin/env bash
# The GPU measurements of BENCHMARKS.md in one command: memory model, OOM guard, training at
# capacity, training throughput. Each part fits one 10-minute call of a lent H100/H200.
#
#   bash bench/gpu_suite.sh memory [OUT]   # calibrate a ~110M-parameter LM in bf16, predicted vs
#                                          # measured peaks, a real OOM recovered by OOMGuard,
#                                          # 200 steps at the calibrated budget (bench/memory_gpu.py)
#   bash bench/gpu_suite.sh train  [OUT]   # tokens/s of fixed / padded / packed batches, same model
#                                          # and data (bench/train.py --device cuda --dtype bf16)
#   bash bench/gpu_suite.sh ttq    [OUT]   # time to a target held-out loss: fixed (lr sweep) vs padded /
#                                          # packed budgets by lr rule, and at equal tokens per step
#                                          # (bench/time_to_quality.py; 25M model; sized for one
#                                          # 10-minute call, not yet run on a GPU)
#   bash bench/gpu_suite.sh all    [OUT]
#   bash bench/gpu_suite.sh dry-run [OUT]  # the same code paths on CPU with tiny sizes (~2 min)
#
# OUT (default: gpu_results/) receives one JSON file per part and the printed tables (*.txt).
# Padding-free (varlen collate) and torch.compile rows join the train part once those features
# exist in fitbatch; until then the part says so in its table.
set -euo pipefail
cd "$(dirname "$0")/.."
part="${1:-all}"
out="${2:-gpu_results}"
mkdir -p "$out"

gpu_memory() {
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/device.txt"
  # capacity: 90 % of the device, enforced on the allocator by memory_gpu.py
  total_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
  capacity_gib=$(( total_mib * 90 / 100 / 1024 ))
  timeout 590 python bench/memory_gpu.py --device cuda --model-size 100M --capacity "${capacity_gib}GiB" \
    --steps 200 --time-limit 540 --out "$out/memory.json" | tee "$out/memory.txt"
}

gpu_train() {
  timeout 590 python bench/train.py --device cuda --dtype bf16 --model-size 100M --max-len 2048 \
    --budget 65536 --tokens 5000000 --modes fixed,padded,packed --out "$out/train.json" | tee "$out/train.txt"
}

gpu_ttq() {
  # one 10-minute call: 3 fixed rates + 4 budget runs + equal tokens/step + one middle budget
  timeout 590 python bench/time_to_quality.py --device cuda --dtype bf16 --model-size 25M --max-len 2048 \
    --budget 65536 --tokens 4000000 --files 400 --vocab 8192 --threads 4 --lr-sweep 5e-4,1e-3,2e-3 \
    --extra-budgets 16384 --eval-every 100000 --eval-tokens 32768 --time-cap 120 \
    --out "$out/time_to_quality_gpu" | tee "$out/time_to_quality_gpu.txt"
}

dry_run() {
  python bench/memory_gpu.py --device cpu --tiny --out "$out/memory_dry.json" | tee "$out/memory_dry.txt"
  python bench/train.py --device cpu --model-size tiny --max-len 128 --budget 1024 --tokens 4000 \
    --files 20 --vocab 512 --threads 1 --modes fixed,padded,packed --out "$out/train_dry.json" | tee "$out/train_dry.txt"
  python bench/time_to_quality.py --device cpu --model-size tiny --max-len 128 --budget 1024 --tokens 6000 \
    --files 20 --vocab 512 --threads 1 --lr-sweep 3e-3,1e-2 --extra-budgets 512 --eval-every 1000 \
    --eval-tokens 1000 --out "$out/time_to_quality_dry" | tee "$out/time_to_quality_dry.txt"
}

case "$part" in
  memory) gpu_memory ;;
  train) gpu_train ;;
  ttq) gpu_ttq ;;
  all) gpu_memory; gpu_train; gpu_ttq ;;
  dry-run) dry_run ;;
  *) echo "usage: bash bench/gpu_suite.sh memory|train|ttq|all|dry-run [OUT]" >&2; exit 2 ;;
esac

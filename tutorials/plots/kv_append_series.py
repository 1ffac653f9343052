"""Chapter 14's figure data: rope-bench --op append rows (bench/results/h200-append.csv) as one line per
tokens-per-step: tokens, fused us, unfused (RoPE, then the cache write) us, copy us (the bytes the fused
call moves, at the fastest copy). cuda-optimized, bf16, model-dtype cache; prints nothing without such rows.

usage: python3 kv_append_series.py CSV
"""
import csv
import sys

series = {}
with open(sys.argv[1], newline="") as file:
    for row in csv.DictReader(file):
        if (row.get("backend"), row.get("dtype"), row.get("cache_dtype"), row.get("status")) != \
                ("cuda-optimized", "bf16", "model", "ok") or row.get("op") not in ("append", "append-unfused"):
            continue
        batch, _, seq, _ = (int(v) for v in row["shape"].split(","))
        line = series.setdefault(batch * seq, {})
        line[row["op"]] = float(row["median_us"])
        if row["op"] == "append":
            line["copy"] = float(row["median_us"]) * float(row["pct_of_copy"]) / 100.0
for tokens, line in sorted(series.items()):
    if {"append", "append-unfused", "copy"} <= line.keys():
        print(tokens, line["append"], line["append-unfused"], line["copy"])

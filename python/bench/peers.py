#!/usr/bin/env python3
"""rope beside the public RoPE kernels a user would pick instead, all in one run, by rope-bench's method.

    PYTHONPATH=build/gpu/python:python/bench python3 python/bench/peers.py OUTDIR [--rope-bench PATH] [--quick]

Rows (issue 31's): plain bhsd and bshd, fp32 and bf16, at [8,32,4096,128] and [4,32,2048,128]; Llama-3-8B prefill
(bshd [1,4096,32,128] q, 8 k heads, bf16); packed THD (the 7 sequences of `rope-bench --packed 1..8192:32768`,
32 q and 8 k heads, bf16); M-RoPE with Qwen2-VL's sections (bshd [1,28,8192,128] q, 4 k heads, bf16); a caller's
cos/sin table (bshd [8,32,4096,128], bf16); decode [1,32,1,128] and [4,8,256,64], fp32. Implementations: rope
(rope.ops.rope_ in place, rope.ops.rope out of place) and, where importable, Liger-Kernel, FlashInfer, HF's
apply_rotary_pos_emb eager and under torch.compile (static shapes), flash-attn's Triton rotary, and vLLM's
triton_mrope (M-RoPE row). Each is used as installed; where a package is not, scripts/stage-peers stages
FlashInfer's headers (compiled here with nvcc through python/bench/peers_flashinfer.cu), flash-attn's rotary.py
and pure-Python wheels into .carry/peers/. A peer that cannot run a row is reported as skipped, with why.

The method (rope-bench's, bench/timing/timing.hpp), with PyTorch's tools:
- every implementation first runs once on fresh inputs and is checked against a float64 reference (max abs and
  relative L2 error); out-of-place outputs are poisoned (the allocator's blocks of their size filled with NaN
  just before the call); a wrong result is reported and left out of the comparison;
- the calls rotate through sets of q and k spanning twice the L2 (op_cost.Sets), whole passes per batch;
- a batch (>= 1 ms of GPU work, at most 512 calls when queued) is timed with CUDA events, queued behind a GPU
  sleep that outlasts the host's issuing of it (no Python launch cost), issued directly (`queued`) or replayed
  from a CUDA graph (`graph`); each figure is the median of --reps batches, then of --rounds rounds, every
  implementation timed once per round, round-robin (the GPU's speed drifts);
- the copy ceiling: PyTorch's copy of the same bytes (q and k) timed both ways in the same rounds; % of copy is
  against the faster (rope-bench's rule: a slow way of copying never flatters anyone);
- where rope-bench is found (--rope-bench), its own reading of rope's in-place call on each row (bench_* columns).
Writes OUTDIR/peers.csv (stamped with date, device, commit, command) and prints it as a table.
"""

import argparse, ctypes, csv, datetime, importlib, importlib.metadata, importlib.util, inspect, itertools, math, os
import shlex, shutil, statistics, subprocess, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BASE = 10000.0
SECTIONS = [16, 24, 24]  # Qwen2-VL's M-RoPE pairs per axis: temporal, height, width.
TOLERANCE = {"fp32": 1e-3, "bf16": 3e-2}  # Relative L2 error above which a result counts as wrong.
PLAIN = [(f"[{','.join(map(str, s))}] {d} {l}", "plain", l, s, 32, d)
         for s in ((8, 32, 4096, 128), (4, 32, 2048, 128)) for d in ("fp32", "bf16") for l in ("bhsd", "bshd")]
ROWS = [  # (case, form, layout, (B, H, N, D), k heads, dtype): the rows where rope was behind first.
    ("Llama-3-8B prefill", "plain", "bshd", (1, 32, 4096, 128), 8, "bf16"), PLAIN[0], PLAIN[6],
    ("M-RoPE (Qwen2-VL sections)", "mrope", "bshd", (1, 28, 8192, 128), 4, "bf16"),
    ("decode", "plain", "bhsd", (1, 32, 1, 128), 32, "fp32"),
    ("[4,8,256,64] fp32", "plain", "bhsd", (4, 8, 256, 64), 8, "fp32"),
    ("packed THD", "packed", "thd", (1, 32, 32768, 128), 8, "bf16"),
    ("caller's cos/sin table", "table", "bshd", (8, 32, 4096, 128), 32, "bf16")] + \
    [row for row in PLAIN if row not in (PLAIN[0], PLAIN[6])]
QUICK = ["[4,32,2048,128] bf16 bshd", "packed THD", "M-RoPE (Qwen2-VL sections)", "decode"]
COLUMNS = ["case", "form", "shape", "kv_heads", "dtype", "layout", "peer", "version", "placement", "timing",
           "median_us", "us_min", "us_max", "copy_us", "pct_of_copy", "max_abs", "rel_l2", "status", "bench_us",
           "bench_copy_us", "bench_pct_of_copy", "rounds", "sets", "section", "command", "date", "commit", "device"]


class Skip(Exception):
    """This peer cannot run this row (the reason goes to the CSV)."""


# --- The rows' positions and the float64 reference (no code under test) ----------------------------------------
def packed_lengths(shortest=1, longest=8192, total=32768, state=2026):
    """rope-bench's drawn lengths (bench/forms.cpp packed_lengths: SplitMix64, fixed seed)."""
    mask, lengths = (1 << 64) - 1, []
    while sum(lengths) < total:
        state = (state + 0x9E3779B97F4A7C15) & mask
        z = ((state ^ (state >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        lengths.append(min(shortest + (z ^ (z >> 31)) % (longest - shortest + 1), total - sum(lengths)))
    return lengths


def positions_of(form, seq):
    """[axes, seq] int64: the positions of the tokens along the sequence axis (M-RoPE: a text prefix of seq/8
    tokens, then a near-square image grid, as rope-bench's --mrope)."""
    import torch
    if form == "packed":
        return torch.cat([torch.arange(n) for n in packed_lengths(total=seq)])[None]
    if form != "mrope":
        return torch.arange(seq)[None]
    text = seq // 8
    width = math.ceil(math.sqrt(seq - text))
    patch = torch.arange(seq - text)
    grid = torch.stack([torch.zeros_like(patch), patch // width, patch % width]) + text
    return torch.cat([torch.arange(text).expand(3, text), grid], dim=1)


def angles(positions, head_dim, form, dtype):
    """[seq, pairs]: position (of the pair's axis) x base^(-2i/d), computed in `dtype`."""
    import torch
    pairs = head_dim // 2
    axes = torch.repeat_interleave(torch.arange(3), torch.tensor(SECTIONS)) if form == "mrope" else \
        torch.zeros(pairs, dtype=torch.long)
    theta = BASE ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    return positions.to(dtype)[axes.to(positions.device), :].T * theta.to(dtype).to(positions.device)


def rotate(x, cos, sin):
    """x [..., seq, d] (half-split pairs) turned by cos/sin [seq, d/2]."""
    import torch
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


# --- One row: the sets of q and k, the positions in every peer's format -----------------------------------------
class Case:
    device = "cuda"  # The tests build cases on the host.

    def __init__(self, row, sets_class):
        import torch
        self.name, self.form, self.layout, self.shape, self.kv, self.dtype_name = row
        batch, heads, seq, dim = self.shape
        self.dtype = torch.float32 if self.dtype_name == "fp32" else torch.bfloat16
        physical = {"bhsd": lambda h: (batch, h, seq, dim), "bshd": lambda h: (batch, seq, h, dim),
                    "thd": lambda h: (batch * seq, h, dim)}[self.layout]
        self.sets = sets_class(torch.Size(physical(heads)), torch.Size(physical(self.kv)), self.dtype, self.device)
        self.inputs = [self.sets.q[0].clone(), self.sets.k[0].clone()]
        self.positions = positions_of(self.form, seq).to(self.device)
        if self.form == "packed":
            lengths = packed_lengths(total=seq)
            self.cu_seqlens = torch.tensor([0] + list(itertools.accumulate(lengths)), device=self.device)
            self.longest = max(lengths)
        a64 = angles(self.positions, dim, self.form, torch.float64)
        self.want = [rotate(self.logical(x).double(), a64.cos(), a64.sin()) for x in self.inputs]
        a32 = angles(self.positions, dim, self.form, torch.float32)  # As HF's rotary embedding computes them.
        self.cos = torch.cat([a32.cos()] * 2, dim=-1)[None].to(self.dtype)  # [1, seq, d]: HF, Liger.
        self.sin = torch.cat([a32.sin()] * 2, dim=-1)[None].to(self.dtype)
        per_axis = [angles(self.positions[a:a + 1], dim, "plain", torch.float32) for a in range(3)] \
            if self.form == "mrope" else []
        self.cos3 = [torch.stack([torch.cat([f(a)] * 2, -1)[None] for a in per_axis]).to(self.dtype) for f in
                     (torch.cos, torch.sin)] if per_axis else None  # [3, 1, seq, d]: Liger's M-RoPE.
        self.half = [f(angles(torch.arange(self.longest if self.form == "packed" else seq, device=self.device)[None],
                              dim, "plain", torch.float32)).to(self.dtype) for f in (torch.cos, torch.sin)]
        self.tokens = batch * seq
        self.token_positions = self.positions[0].repeat(batch)  # FlashInfer: one position per token.
        import rope
        self.config = rope.Config(head_dim=dim, mrope_section=SECTIONS if self.form == "mrope" else None)
        self.table = torch.from_numpy(self.config.cos_sin_cache(seq)).to(self.device) if self.form == "table" else None

    def logical(self, x):
        """[batch, heads, seq, dim] view of a tensor in this row's layout."""
        return x if self.layout == "bhsd" else x.transpose(1, 2) if self.layout == "bshd" else x[None].transpose(1, 2)

    def physical(self, x):
        """The inverse of logical()."""
        return x if self.layout == "bhsd" else x.transpose(1, 2) if self.layout == "bshd" else x.transpose(1, 2)[0]

    def rope_arguments(self):
        return dict(layout=self.layout, cu_seqlens=getattr(self, "cu_seqlens", None), cos_sin_cache=self.table,
                    positions=self.positions if self.form == "mrope" else None)

    def token_view(self, x):
        """FlashInfer's [tokens, heads, dim] as (token stride, head stride), where one view holds every token."""
        if self.layout == "bhsd" and self.shape[0] > 1:
            raise Skip("FlashInfer takes [tokens, heads, head_dim] strides: bhsd with batch > 1 is not one view")
        return (x.stride(2), x.stride(1)) if self.layout == "bhsd" else (x.stride(-3), x.stride(-2))


# --- The peers: each maker returns call(i) (rotating set i, returning q and k in the row's layout) or raises Skip --
def peer_makers(stage, nvcc_job):
    import torch
    import rope
    import transformers
    from rope import ops
    from transformers.models.llama import modeling_llama

    def rope_call(function):
        return lambda c: (lambda i: function(c.sets.q[i], c.sets.k[i], c.config, **c.rope_arguments()))

    def hf(function):
        return lambda c: (lambda i: tuple(c.physical(t) for t in function(
            c.logical(c.sets.q[i]), c.logical(c.sets.k[i]), c.cos, c.sin)))

    def compiled(c):
        torch._dynamo.reset()  # One compilation per row (static shapes), never the recompile limit.
        return hf(torch.compile(modeling_llama.apply_rotary_pos_emb, fullgraph=True, dynamic=False))(c)

    makers = [("rope.ops.rope_", f"rope {rope.__version__}", "in", rope_call(ops.rope_)),
              ("rope.ops.rope", f"rope {rope.__version__}", "out", rope_call(ops.rope)),
              ("HF eager", f"transformers {transformers.__version__}", "out",
               hf(modeling_llama.apply_rotary_pos_emb)),
              ("HF torch.compile", f"torch {torch.__version__}, transformers {transformers.__version__}", "out",
               compiled)]
    sys.path.append(str(stage / "site"))  # Staged wheels, behind anything installed.
    try:
        from liger_kernel.transformers.rope import liger_rotary_pos_emb
        from liger_kernel.transformers.qwen2vl_mrope import liger_multimodal_rotary_pos_emb as liger_mrope

        def liger(c):
            q, k = (lambda i: c.logical(c.sets.q[i])), (lambda i: c.logical(c.sets.k[i]))
            if c.form == "mrope":
                return lambda i: tuple(c.physical(t) for t in liger_mrope(q(i), k(i), *c.cos3, SECTIONS))
            return lambda i: tuple(c.physical(t) for t in liger_rotary_pos_emb(q(i), k(i), c.cos, c.sin))
        makers.append(("Liger-Kernel", f"liger-kernel {importlib.metadata.version('liger-kernel')}", "in", liger))
    except Exception as error:  # ImportError, or a package that fails while importing.
        makers.append(("Liger-Kernel", "", "in", f"not importable ({type(error).__name__}: {error})"))
    makers.append(("FlashInfer", *flashinfer_maker(stage, nvcc_job)))
    makers.append(("flash-attn (Triton)", *flash_attn_maker(stage)))
    try:
        from vllm.model_executor.layers.rotary_embedding.mrope import triton_mrope
        import vllm

        def vllm_mrope(c):
            if c.form != "mrope":
                raise Skip("M-RoPE row only")
            cos, sin = (t[:, 0, :, :c.shape[3] // 2].contiguous() for t in c.cos3)  # [3, tokens, d/2]
            flat = lambda x: x.view(c.tokens, -1)  # noqa: E731
            neox = {"is_neox_style": True} if "is_neox_style" in inspect.signature(triton_mrope).parameters else {}
            return lambda i: (triton_mrope(flat(c.sets.q[i]), flat(c.sets.k[i]), cos, sin, SECTIONS, c.shape[3],
                                           c.shape[3], False, **neox), (c.sets.q[i], c.sets.k[i]))[1]
        makers.append(("vLLM triton_mrope", f"vllm {vllm.__version__}", "in", vllm_mrope))
    except Exception as error:
        makers.append(("vLLM triton_mrope", "", "in", f"not importable ({type(error).__name__}: {error})"))
    return makers


def flashinfer_maker(stage, nvcc_job):
    """FlashInfer's in-place RoPE: the installed package's functions, else the staged headers through our launcher."""
    try:
        import flashinfer
        version, library = f"flashinfer-python {flashinfer.__version__}", None
    except Exception:  # Not installed, or installed without what it needs here.
        if nvcc_job is None:
            return "", "in", "not importable, and no staged headers (scripts/stage-peers --flashinfer) or no nvcc"
        version, library = (stage / "flashinfer" / "VERSION").read_text().strip() + ", own launcher", nvcc_job

    def make(c):
        import torch
        if c.dtype != torch.bfloat16 or c.form == "mrope":
            raise Skip("FlashInfer's RoPE takes fp16/bf16 only" if c.form != "mrope" else "no M-RoPE in FlashInfer")
        q_strides, k_strides = c.token_view(c.sets.q[0]), c.token_view(c.sets.k[0])
        ids = c.token_positions.to(torch.int64 if c.form == "table" else torch.int32)
        if library is None:  # The package: its own functions take the [tokens, heads(, dim)] views.
            view = lambda x: x.as_strided((c.tokens, x.numel() // c.tokens // c.shape[3], c.shape[3]),  # noqa: E731
                                          (*c.token_view(x), 1))
            if c.form == "table":
                return lambda i: (flashinfer.apply_rope_with_cos_sin_cache_inplace(
                    ids, view(c.sets.q[i]).flatten(1), view(c.sets.k[i]).flatten(1), c.shape[3], c.table, True),
                    (c.sets.q[i], c.sets.k[i]))[1]
            return lambda i: (flashinfer.apply_rope_pos_ids_inplace(view(c.sets.q[i]), view(c.sets.k[i]), ids,
                                                                    rope_theta=BASE), (c.sets.q[i], c.sets.k[i]))[1]
        lib = library.load()
        heads = (c.shape[1], c.kv, c.shape[3])

        def call(i):
            q, k, stream = c.sets.q[i], c.sets.k[i], torch.cuda.current_stream().cuda_stream
            if c.form == "table":
                status = lib.peers_rope_cos_sin_cache(q.data_ptr(), k.data_ptr(), c.table.data_ptr(), ids.data_ptr(),
                                                      c.tokens, *heads, *q_strides, *k_strides, stream)
            else:
                status = lib.peers_rope_pos_ids(q.data_ptr(), k.data_ptr(), ids.data_ptr(), c.tokens, *heads,
                                                *q_strides, *k_strides, ctypes.c_float(BASE), stream)
            if status != 0:
                raise RuntimeError(f"FlashInfer launcher: error {status}")
            return q, k
        return call
    return version, "in", make


class Launcher:
    """python/bench/peers_flashinfer.cu compiled with nvcc against the staged headers, in the background."""

    def __init__(self, include, arch):
        self.path = Path(tempfile.mkdtemp(prefix="peers-")) / "peers_flashinfer.so"
        nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
        self.job = subprocess.Popen([nvcc, "-std=c++17", "-O3", f"-arch=sm_{arch}", "-shared", "-Xcompiler",
                                     "-fPIC", "-I", str(include), str(Path(__file__).with_name(
                                         "peers_flashinfer.cu")), "-o", str(self.path)],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lib = None

    def load(self):
        if self.lib is None:
            output = self.job.communicate()[0]
            if self.job.returncode != 0:
                raise RuntimeError(f"nvcc failed on peers_flashinfer.cu: {output[-300:]}")
            self.lib = ctypes.CDLL(str(self.path))
            sizes = [ctypes.c_uint32] * 4 + [ctypes.c_size_t] * 4
            self.lib.peers_rope_pos_ids.argtypes = [ctypes.c_void_p] * 3 + sizes + [ctypes.c_float, ctypes.c_void_p]
            self.lib.peers_rope_cos_sin_cache.argtypes = [ctypes.c_void_p] * 4 + sizes + [ctypes.c_void_p]
        return self.lib


def flash_attn_maker(stage):
    """flash-attn's Triton apply_rotary, in place, on q then k: installed, else the staged rotary.py."""
    try:
        from flash_attn.ops.triton.rotary import apply_rotary
        import flash_attn
        version = f"flash-attn {flash_attn.__version__}"
    except Exception:
        path = stage / "flash_attn_rotary" / "rotary.py"
        if not path.exists():
            return "", "in", "not importable, and no staged rotary.py (scripts/stage-peers --flash-attn)"
        spec = importlib.util.spec_from_file_location("flash_attn_rotary", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        apply_rotary, version = module.apply_rotary, (path.parent / "VERSION").read_text().strip()

    def make(c):
        if c.form == "mrope":
            raise Skip("no M-RoPE in flash-attn's rotary")
        view = (lambda x: x.transpose(1, 2)) if c.layout == "bhsd" else (lambda x: x)  # [batch, seq, heads, dim]
        packed = dict(cu_seqlens=c.cu_seqlens.int(), max_seqlen=c.longest) if c.form == "packed" else {}
        return lambda i: tuple((apply_rotary(view(x), *c.half, inplace=True, **packed), x)[1]
                               for x in (c.sets.q[i], c.sets.k[i]))
    return version, "in", make


# --- Checking and timing --------------------------------------------------------------------------------------
def check(case, call):
    """(max abs, relative L2) error of call(0) on fresh inputs against float64; out-of-place outputs poisoned."""
    import torch
    case.sets.q[0].copy_(case.inputs[0])
    case.sets.k[0].copy_(case.inputs[1])
    sync = torch.cuda.synchronize if case.device == "cuda" else (lambda: None)
    torch.cuda.empty_cache()  # Then the only cached blocks of the outputs' sizes are these, NaN-filled:
    poison = [torch.full_like(x, float("nan")) for x in case.inputs for _ in range(2)]
    del poison  # what the allocator hands the outputs next.
    got = [case.logical(x).double() for x in call(0)]
    sync()
    if not all(torch.isfinite(g).all() for g in got):
        return math.inf, math.inf
    diff = sum(float(((g - w) ** 2).sum()) for g, w in zip(got, case.want))
    norm = sum(float((w ** 2).sum()) for w in case.want)
    return max(float((g - w).abs().max()) for g, w in zip(got, case.want)), math.sqrt(diff / norm)


class Timer:
    """A batch of calls (whole passes over the sets, >= 1 ms of GPU work; queued: at most 512 calls), timed with
    CUDA events behind a GPU sleep that outlasts the host's issuing of the batch (so no launch cost is timed)."""

    def __init__(self, call, count, graph):
        import torch
        self.start, self.stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # Warm-up on every set, off the capture, as PyTorch asks.
            for i in range(count):
                call(i)
        torch.cuda.current_stream().wait_stream(side)
        began = time.perf_counter()  # One pass, to size the sleep before the next: its GPU time alone sizes a batch.
        for i in range(count):
            call(i)
        torch.cuda._sleep(int(min(2e9, 4e9 * (time.perf_counter() - began) + 2e4)))
        self.start.record()
        for i in range(count):
            call(i)
        self.stop.record()
        self.stop.synchronize()
        calls = count * max(1, math.ceil(1.0 / max(self.start.elapsed_time(self.stop), 1e-3)))
        self.calls = calls if graph else min(calls, 512)
        visits = itertools.count()
        self.batch = lambda: [call(next(visits) % count) for _ in range(self.calls)]  # noqa: E731
        if graph:
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.batch()
            self.batch = self.graph.replay
        self.batch()
        torch.cuda.synchronize()
        began = time.perf_counter()
        self.batch()
        self.sleep = int(min(2e9, 2 * 2e9 * (time.perf_counter() - began) + 2e4))  # Cycles, at up to 2 GHz.
        torch.cuda.synchronize()

    def run(self, reps):
        import torch
        times = []
        for _ in range(reps):
            torch.cuda._sleep(self.sleep)
            self.start.record()
            self.batch()
            self.stop.record()
            self.stop.synchronize()
            times.append(self.start.elapsed_time(self.stop) * 1000.0 / self.calls)
        return statistics.median(times)


def rope_bench_reading(path, case, graph):
    """rope-bench's (median us, % of copy) of rope's in-place call on this row, or an error text."""
    batch, heads, seq, dim = case.shape
    command = [path, "--backend", "cuda-optimized", "--shape", f"{batch},{heads},{seq},{dim}", "--kv-heads",
               str(case.kv), "--dtype", case.dtype_name, "--layout", case.layout, "--reps", "30", "--format", "csv",
               *{"packed": ["--packed", f"1..8192:{seq}"], "mrope": ["--mrope", "contiguous"],
                 "table": ["--table"]}.get(case.form, []), *(["--graph"] if graph else [])]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"rope-bench failed: {error}"[:200]
    rows = list(csv.DictReader(done.stdout.splitlines()))
    if done.returncode or not rows or rows[0]["status"] != "ok":
        return f"rope-bench failed: {(done.stderr or done.stdout)[-200:]}"
    return float(rows[0]["median_us"]), float(rows[0]["pct_of_copy"])


def measure(case, makers, args):
    """Every peer's rows for one case."""
    import torch
    rows, timers = [], {}
    base = dict(case=case.name, form=case.form, shape=",".join(map(str, case.shape)), kv_heads=case.kv,
                dtype=case.dtype_name, layout=case.layout, sets=case.sets.count)
    entries = [("copy (ceiling)", f"torch {torch.__version__}", "out", lambda c: c.sets.copy)] + makers
    for name, version, placement, make in entries:
        row = dict(base, peer=name, version=version, placement=placement)
        try:
            if isinstance(make, str):
                raise Skip(make)
            call = make(case)
            if name != "copy (ceiling)":
                errors = check(case, call)
                row["max_abs"], row["rel_l2"] = (f"{e:.3g}" for e in errors)
                if not errors[1] <= TOLERANCE[case.dtype_name]:
                    rows.append(dict(row, status=f"wrong: relative L2 error {row['rel_l2']} against float64"))
                    continue
            for timing in ("queued", "graph"):
                try:
                    timers[(name, timing)] = (Timer(call, case.sets.count, timing == "graph"), [])
                except Exception as error:  # A capture a peer does not survive: its other timing still counts.
                    rows.append(dict(row, timing=timing, status=f"failed: {type(error).__name__}: {error}"[:240]))
            rows += [dict(row, timing=t) for t in ("queued", "graph") if (name, t) in timers]
        except Skip as why:
            rows.append(dict(row, status=f"skipped: {why}"[:240]))
        except Exception as error:  # One peer's failure is its row's status; the run goes on.
            rows.append(dict(row, status=f"failed: {type(error).__name__}: {error}"[:240]))
    order = list(timers.values())
    for round_ in range(args.rounds):  # Round-robin, each round starting one further along.
        for timer, samples in order[round_ % len(order):] + order[:round_ % len(order)]:
            samples.append(timer.run(args.reps))
    copies = [statistics.median(s) for (n, _), (_, s) in timers.items() if n == "copy (ceiling)"]
    ceiling = min(copies) if copies else None
    for row in rows:
        if (row["peer"], row.get("timing")) in timers and "status" not in row:
            samples = timers[(row["peer"], row["timing"])][1]
            us = statistics.median(samples)
            row.update(median_us=f"{us:.2f}", us_min=f"{min(samples):.2f}", us_max=f"{max(samples):.2f}",
                       copy_us=f"{ceiling:.2f}", pct_of_copy=f"{100 * ceiling / us:.1f}", rounds=len(samples),
                       status="ok")
        if row["peer"] == "rope.ops.rope_" and args.rope_bench and row.get("timing"):
            reading = rope_bench_reading(args.rope_bench, case, row["timing"] == "graph")
            if isinstance(reading, str):
                row["bench_us"] = reading
            else:
                row.update(bench_us=f"{reading[0]:.2f}", bench_pct_of_copy=f"{reading[1]:.1f}",
                           bench_copy_us=f"{reading[0] * reading[1] / 100:.2f}")
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog="rows: " + "; ".join(
        r[0] for r in ROWS))
    parser.add_argument("outdir")
    found = [str(ROOT / "build" / b / "bench/rope-bench") for b in ("gpu", "default")
             if (ROOT / "build" / b / "bench/rope-bench").exists()]
    parser.add_argument("--rope-bench", default=(found or [shutil.which("rope-bench")])[0],
                        help="rope-bench, for its reading of rope's in-place call on each row (default: the build's)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: rows " + "; ".join(QUICK) +
                        ", 1 round of 3 batches")
    parser.add_argument("--only", action="append", help="rows whose case names contain this text (repeatable)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each timing every implementation once")
    parser.add_argument("--reps", type=int, default=10, help="timed batches per implementation per round")
    parser.add_argument("--deadline", type=float, help="seconds after which no further row starts")
    parser.add_argument("--peers-dir", type=Path, default=ROOT / ".carry" / "peers", help="scripts/stage-peers' output")
    parser.add_argument("--device", help="the device named in the CSV (default: PyTorch's name for it)")
    parser.add_argument("--commit", help="the commit named in the CSV (default: git describe)")
    parser.add_argument("--command", help="the command recorded in the CSV (default: this one)")
    args = parser.parse_args()
    began = time.monotonic()
    import torch
    if not torch.cuda.is_available():
        print("SKIPPED: no CUDA device")
        return 77
    from op_cost import Sets
    if args.quick:
        args.rounds, args.reps, args.only = 1, 3, args.only or QUICK
    include = args.peers_dir / "flashinfer" / "include"
    major, minor = torch.cuda.get_device_capability()
    launcher = Launcher(include, f"{major}{minor}") if (include / "flashinfer" / "pos_enc.cuh").exists() else None
    makers = peer_makers(args.peers_dir, launcher)
    stamp = dict(date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                 device=args.device or torch.cuda.get_device_name(), command=args.command or shlex.join(
                     ["python3", "python/bench/peers.py", "OUT"] + sys.argv[2:]),
                 commit=args.commit or subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
                                                      capture_output=True, text=True).stdout.strip())
    os.makedirs(args.outdir, exist_ok=True)
    path = os.path.join(args.outdir, "peers.csv")
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS, restval="")
        writer.writeheader()
        for row in ROWS:
            if args.only and not any(text in row[0] for text in args.only):
                continue
            if args.deadline is not None and time.monotonic() - began > args.deadline:
                print(f"deadline ({args.deadline:.0f} s) passed: {row[0]} and the rows after it not run")
                break
            case = Case(row, Sets)
            section = f"{row[0]}: {row[2]} [{','.join(map(str, row[3]))}] + {row[4]} k heads, {row[5]}"
            for result in measure(case, makers, args):
                writer.writerow(dict(result, section=section, **stamp))
                print(f"{row[0]:<28} {result['peer']:<20} {result.get('timing', ''):<6} "
                      f"{result.get('median_us', ''):>9} us {result.get('pct_of_copy', ''):>6} % of copy  "
                      f"err {result.get('rel_l2', ''):<9} bench {result.get('bench_us', '')}  "
                      f"{'' if result.get('status') == 'ok' else result.get('status')}", flush=True)
            f.flush()
            del case
            torch.cuda.empty_cache()
    print(f"device: {stamp['device']}; written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`engramctl bench`: restore against re-prefill, per tier, against the bandwidth floor, and multi-turn savings.

    presets.py       random-weight models (tiny, granite-4.0-h-350m) + an offline ChatML tokenizer
    gguf_presets.py  a preset converted once to a cached GGUF (f16, q8_0, f32) for the llama.cpp backend
    llama_ref.py     raw llama-cpp-python on the same GGUF: the speed reference
    material.py      seeded filler text and the fixed user messages
    timing.py        wall + CPU time, median and spread, the idle check
    memory.py        resident weight bytes (mapped GGUF pages via /proc/self/smaps)
    coldio.py        page-cache eviction (posix_fadvise) and residency (mincore) for cold reads
    workloads/       bandwidth floor, speed, context sweep, multi-turn chat, snapshot saves
    runner.py        BenchConfig, run_bench() -> the JSON object
    report.py        text tables and the optional PNG plot

The command itself is engramctl/cli/bench.py; figures and the JSON schema are in BENCHMARKS.md.
"""

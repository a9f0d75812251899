"""The benchmark's workloads, each a function of (engine or nothing, store context, settings) -> a JSON-ready dict:

bandwidth.py  the floor: memory-copy and cold sequential disk-read bandwidth, measured in the same run
speed.py      prefill and decode speed against raw llama.cpp and transformers in the same run
contexts.py   context sweep: re-prefill vs restore from RAM and from disk, TTFT of a new message both ways
multiturn.py  an N-turn chat, stateful (snapshots) vs stateless (history re-prefilled each turn),
              and the snapshot saves of the stateful side (save.py summarises them)
"""

"""DeepSeek-style N-gram conditional memory (Engram): tokenizer compression, the demo-exact hash of suffix
n-grams into prime-sized tables, and the gated fusion of the looked-up rows into the residual stream.

Specification: ../shared/reference/ngram-memory-spec.md. Plain torch and numpy; nothing here needs a GPU.
"""

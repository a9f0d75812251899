"""Hardware detection, tier budget planning and hot-copy placement (VRAM, RAM; disk is the store's)."""

"""Model loading, state capture/injection and the generation loop: the only torch model code."""

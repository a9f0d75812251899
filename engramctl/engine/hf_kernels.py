"""Which kernels a loaded transformers model's recurrent layers run: mamba-ssm / causal-conv1d, or PyTorch's
reference code. The answer ends ModelInfo.build on transformers (`engramctl ps`, `daemon status`, `tiers`).

How transformers 5.23 decides (integrations/hub_kernels.py `use_kernel_func_from_hub_with_fallback`): each
op of a recurrent family's modeling file (`causal_conv1d_fn`/`_update` from causal_conv1d;
`mamba_chunk_scan_combined`, `selective_state_update`, ... from mamba_ssm; `chunk_gated_delta_rule` from fla)
is bound once, when that modeling file is first imported: `import <package>` and find the op in it; any
failure binds PyTorch's reference code instead. Nothing else decides: `config.use_mamba_kernels=False` is
deprecated and ignored, the old `is_fast_path_available` is gone, and the device is never checked, so a
bound kernel is called on CPU tensors too (mamba-ssm's Triton and causal-conv1d's CUDA code need CUDA
tensors). The Hub's `kernels` only replace these ops after `from_pretrained(use_kernels=True)`, which
engramctl does not pass.

So this module reads the binding transformers made, from each op wrapper's closure (`package`,
`func_name`, `is_new_implementation`), instead of guessing it again: what it reports is what runs.
Stdlib only; nothing here imports torch or transformers.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass
from typing import Iterable

# import name -> what `pip install` calls it
DISTRIBUTIONS = {"mamba_ssm": "mamba-ssm", "causal_conv1d": "causal-conv1d", "fla": "flash-linear-attention"}
_CLOSURE = ("func_name", "package", "is_new_implementation")  # the wrapper's free variables we read


@dataclass(frozen=True)
class OpBinding:
    """One op of the modeling file: transformers' name for it, the package that provides it, and whether
    transformers bound it to that package (else to its PyTorch reference)."""

    func_name: str  # "mamba_chunk_scan_combined"
    package: str  # import name: "mamba_ssm"
    kernel: bool


def binding_of(fn) -> OpBinding | None:
    """What transformers bound the op wrapper `fn` to; None when `fn` is not such a wrapper. Follows
    `__wrapped__` because the Hub's `kernels`, when installed, may wrap the wrapper once more."""
    seen = 0
    while callable(fn) and seen < 4:
        code = getattr(fn, "__code__", None)
        cells = getattr(fn, "__closure__", None)
        if code is not None and cells and all(v in code.co_freevars for v in _CLOSURE):
            values = {name: cell.cell_contents for name, cell in zip(code.co_freevars, cells) if name in _CLOSURE}
            return OpBinding(str(values["func_name"]), str(values["package"]), bool(values["is_new_implementation"]))
        fn, seen = getattr(fn, "__wrapped__", None), seen + 1
    return None


def model_bindings(model) -> list[OpBinding]:
    """The ops of `model`'s modeling file (transformers.models.<family>.modeling_<family>), as bound."""
    module = sys.modules.get(type(model).__module__)
    found = []
    for value in vars(module).values() if module is not None else ():
        b = binding_of(value) if callable(value) else None
        if b is not None and b not in found:
            found.append(b)
    return found


def _why_unbound(package: str) -> str:
    """Why transformers fell back for `package`'s ops, in the words a user acts on."""
    name = DISTRIBUTIONS.get(package, package)
    if package not in sys.modules:
        try:
            spec = importlib.util.find_spec(package)  # does not import it
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            return f"{name} not installed"
    try:  # transformers' own test; it imported (or failed to) already, so this repeats no real work
        importlib.import_module(package)
    except Exception as e:  # a CUDA extension that fails to load on this machine, say
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        return f"{name} does not import: {first}"
    return f"{name} lacks the ops transformers looks for (too old?)"


@dataclass(frozen=True)
class KernelPath:
    kernels: tuple[str, ...]  # distributions whose ops run: ("mamba-ssm", "causal-conv1d")
    fallback: tuple[str, ...]  # why the other ops run PyTorch's code: ("not on CUDA", "mamba-ssm not installed")
    device: str

    @property
    def all_kernels(self) -> bool:
        return bool(self.kernels) and not self.fallback

    def describe(self) -> str:
        if not self.kernels and not self.fallback:
            return ""
        on_cuda = self.device.startswith("cuda")
        names = " + ".join(self.kernels)
        if self.kernels and not on_cuda:
            # transformers calls a bound kernel whatever the device: say so rather than claim a fallback
            return f"{names} kernels bound on a {self.device} model (they need CUDA tensors)"
        if self.all_kernels:
            return f"{names} CUDA kernels"
        fallback = f"PyTorch fallback: {'; '.join(self.fallback)}"
        return f"{names} CUDA kernels, the other ops {fallback}" if self.kernels else fallback


def kernel_path(device: str, bindings: Iterable[OpBinding]) -> KernelPath:
    """The decision for a model on `device` whose ops are bound as `bindings`. A package counts as running
    only when every one of its ops is bound to it."""
    packages: dict[str, bool] = {}
    order = list(DISTRIBUTIONS)  # a stable order for the line, whatever order the modeling file has
    for b in sorted(bindings, key=lambda b: (order.index(b.package) if b.package in order else len(order), b.package)):
        packages[b.package] = packages.get(b.package, True) and b.kernel
    kernels = tuple(DISTRIBUTIONS.get(p, p) for p, bound in packages.items() if bound)
    fallback = [] if device.startswith("cuda") or not packages else [f"not on CUDA ({device})"]
    fallback += [_why_unbound(p) for p, bound in packages.items() if not bound]
    return KernelPath(kernels=kernels, fallback=tuple(fallback), device=device)


def describe_model(model, device: str) -> str:
    """One line for ModelInfo.build: which path `model`'s recurrent layers take on `device`; "" for a model
    whose modeling file binds no such op (plain attention)."""
    return kernel_path(device, model_bindings(model)).describe()

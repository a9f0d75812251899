"""Install llama-cpp-python VERSION into VENV, built from source as llama_build_args.py chooses, and prove the build
runs on this machine before leaving it there. scripts/install_llama.sh runs it with the system python3 (standard
library only; engramctl is not installed yet):

    python3 scripts/install_llama.py VENV VERSION

1. The build: CUDA for the GPUs' own architectures when nvidia-smi lists a GPU and nvcc is there, else the CPU
   build (CI's); the CPU side at the first level of llama_build_args.CPU_LEVELS (native) unless ENGRAM_LLAMA_CPU
   names one. The build already installed is kept when its args (the mark file) are these.
2. The smoke test (scripts/llama_smoke.py, in a child process of the venv's python): a small GGUF loaded, prompts
   prefilled in several ubatch shapes (the batched kernels: AMX, repacked weights, llamafile sgemm), a few tokens
   decoded, on the daemon's threads. A child that dies by a signal means this build does not run on this CPU:
   the next level is built (native -> no-amx -> portable), with one line on stderr saying what died, what is built
   instead and why. Any other failure of the smoke test is an error (exit 1).
3. The mark file (VENV/share/engramctl/llama-cpp-python.cmake-args): first line the installed build's args; then
   `level=`, `smoke=passed` once the test ran here, and `died=<level> <signal>` per level that died here. A second
   run with a passed mark neither rebuilds nor re-tests; a level recorded as dying with the same args is skipped.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
MARK = Path("share") / "engramctl" / "llama-cpp-python.cmake-args"
# ggml-cuda is 69 .cu files and ~120 template instances per architecture: 90-real took 2,076 s on 2 cores
CUDA_BUILD_TIME = "~35 minutes per GPU architecture on 2 cores, less with more"
SMOKE_TIMEOUT_S = 600


def _build_args():
    spec = importlib.util.spec_from_file_location("llama_build_args", HERE / "llama_build_args.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


@dataclass
class Mark:
    """What the mark file says of the installed build."""

    args: str | None = None
    level: str | None = None
    smoke: bool = False
    died: dict[str, str] = field(default_factory=dict)  # level -> "<signal> <args>"

    @classmethod
    def read(cls, path: Path) -> "Mark":
        try:
            lines = path.read_text().splitlines()
        except OSError:
            return cls()
        mark = cls(args=lines[0].strip() if lines else None)
        for line in lines[1:]:
            key, _, value = line.partition("=")
            if key == "level":
                mark.level = value
            elif key == "smoke":
                mark.smoke = value == "passed"
            elif key == "died":
                level, _, rest = value.partition(" ")
                mark.died[level] = rest
        return mark

    def write(self, path: Path) -> None:
        lines = [self.args or ""]
        if self.level:
            lines.append(f"level={self.level}")
        if self.smoke:
            lines.append("smoke=passed")
        lines += [f"died={level} {what}" for level, what in self.died.items()]
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".partial")
        tmp.write_text("\n".join(lines) + "\n")
        os.replace(tmp, path)


@dataclass
class Smoke:
    """How the smoke test ended: passed, died by a signal (`signal`), or failed otherwise (`output`)."""

    passed: bool
    signal: str | None = None
    output: str = ""

    @property
    def last_step(self) -> str:
        steps = [ln for ln in self.output.splitlines() if ln.startswith("smoke: ")]
        return steps[-1].removeprefix("smoke: ") if steps else "starting"


def run_smoke(venv: Path) -> Smoke:
    """scripts/llama_smoke.py in a child process of the venv's python."""
    cmd = [str(venv / "bin" / "python"), str(HERE / "llama_smoke.py")]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=SMOKE_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return Smoke(False, output=f"the smoke test did not finish within {SMOKE_TIMEOUT_S} s")
    output = proc.stdout + proc.stderr
    if proc.returncode == 0:
        return Smoke(True, output=output)
    if proc.returncode < 0:
        return Smoke(False, signal=signal.Signals(-proc.returncode).name, output=output)
    return Smoke(False, output=output)


class Installer:
    """One install: `pip` runs the venv's pip (CMAKE_ARGS in its environment), `smoke` runs the smoke test."""

    def __init__(self, venv: Path, version: str, env: dict[str, str], say: Callable[[str], None]):
        self.venv, self.version, self.env, self.say = venv, version, env, say
        self.mark_path = venv / MARK

    def pip(self, args: list[str], cmake_args: str) -> None:
        env = {**self.env, "CMAKE_ARGS": cmake_args}
        env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
        subprocess.run([str(self.venv / "bin" / "pip"), *args], env=env, check=True)

    def installed(self) -> str | None:
        """ "cpu" or "cuda" for the pinned version installed, None otherwise; never loads the library."""
        code = (
            "import importlib.metadata as m, importlib.util as u, pathlib, sys\n"
            "try:\n    ok = m.version('llama_cpp_python') == sys.argv[1]\n"
            "except m.PackageNotFoundError:\n    ok = False\n"
            "spec = u.find_spec('llama_cpp') if ok else None\n"
            "if spec is not None:\n"
            "    lib = pathlib.Path(spec.origin).parent / 'lib'\n"
            "    print('cuda' if any(lib.glob('libggml-cuda*')) else 'cpu')\n"
        )
        proc = subprocess.run(
            [str(self.venv / "bin" / "python"), "-c", code, self.version], capture_output=True, text=True, check=False
        )
        return proc.stdout.strip() or None

    def build(self, args: str, kind: str, have: str | None) -> None:
        """Build and install llama-cpp-python with `args`, replacing whatever build `have` is."""
        spec = f"llama-cpp-python=={self.version}"
        if kind == "cuda":
            # pip's wheel cache keys a built sdist by its URL and hash, not by CMAKE_ARGS (pip/_internal/cache.py):
            # a CUDA wheel there would later be reused for a CPU install. CUDA wheels go to a folder of their own,
            # keyed by their args, so a second venv on this machine installs in seconds.
            self.say(
                f"building llama-cpp-python {self.version} with CUDA from source: {CUDA_BUILD_TIME}; "
                "the wheel is kept, so later installs with the same architectures take seconds"
            )
            py = subprocess.run([str(self.venv / "bin" / "python"), "-V"], capture_output=True, text=True).stdout
            key = hashlib.sha256(f"{self.version} {py.strip()} {args}".encode()).hexdigest()[:16]
            cache = Path(self.env.get("XDG_CACHE_HOME") or Path(self.env.get("HOME", "~")).expanduser() / ".cache")
            wheels = cache / "engramctl" / f"llama-cpp-python-{key}"
            if not list(wheels.glob("llama_cpp_python-*.whl")):
                partial = wheels.with_name(wheels.name + ".partial")
                subprocess.run(["rm", "-rf", str(partial)], check=True)
                wheel = ["wheel", "-q", "--no-deps", "--no-cache-dir", "--no-binary", "llama-cpp-python"]
                self.pip([*wheel, "-w", str(partial), spec], args)
                partial.rename(wheels)
            [whl] = [str(w) for w in wheels.glob("llama_cpp_python-*.whl")][:1]
            if have is None:
                self.pip(["install", "-q", whl], args)
            else:  # the same version is installed (another build): pip would call it satisfied
                self.pip(["install", "-q", "--force-reinstall", "--no-deps", whl], args)
            return
        self.say(
            f"building llama-cpp-python {self.version} from source: the first build takes ~10 minutes on 2 cores; "
            "pip caches the built wheel, so later installs take seconds"
        )
        if have is None:
            self.pip(["install", "-q", spec], args)
        # Another build is installed, or pip's cache held one (a CUDA wheel made outside this script, the native
        # build a smoke test saw die): pip may have taken it from the cache, which does not know CMAKE_ARGS.
        if have is not None or self.installed() != "cpu":
            self.say("installed: a llama-cpp-python build other than this one; building the CPU one afresh")
            self.pip(["install", "-q", "--force-reinstall", "--no-deps", "--no-cache-dir", spec], args)

    def run(self, smoke: Callable[[], Smoke]) -> int:
        ba = _build_args()
        try:
            tries = ba.levels(self.env)
            found = ba.gpus()
        except ba.Refused as e:
            self.say(f"Error: {e}")
            return 2
        mark = Mark.read(self.mark_path)
        have = self.installed()
        builds = []
        for level in tries:
            try:
                argv, reason = ba.choose(self.env, found, level)
            except ba.Refused as e:
                self.say(f"Error: {e}")
                return 2
            cuda = any(
                a.lower() in ("-dggml_cuda=on", "-dggml_cuda=1", "-dggml_cuda=true", "-dggml_cuda=yes") for a in argv
            )
            builds.append((level, ba.join(argv), reason, "cuda" if cuda else "cpu"))
        # a build that died here before, with these very args, is not tried again
        left = [b for b in builds if mark.died.get(b[0], "").partition(" ")[2] != b[1]]
        for i, (level, args, reason, kind) in enumerate(left):
            # a CPU build installed before install_llama recorded its args is today's native one
            same = have == kind and (mark.args == args or (mark.args is None and kind == "cpu" and level == "native"))
            if same and mark.smoke and mark.args == args:
                return 0
            if not same:
                self.say(reason)
                self.build(args, kind, have)
                have = self.installed()
                if have != kind:
                    self.say(f"Error: llama-cpp-python {self.version} is not the {kind} build after installing it")
                    return 1
            mark.args, mark.level, mark.smoke = args, level, False
            mark.write(self.mark_path)
            result = smoke()
            if result.passed:
                mark.smoke = True
                mark.write(self.mark_path)
                return 0
            if result.signal is None:
                self.say(
                    f"Error: the llama.cpp smoke test failed ({result.last_step}), not by a signal, so it is not "
                    f"a CPU problem:\n{result.output.strip()[-2000:]}"
                )
                return 1
            mark.died[level] = f"{result.signal} {args}"
            mark.write(self.mark_path)
            if i + 1 < len(left):
                after = left[i + 1][0]
                self.say(
                    f"llama.cpp: the {level} build died of {result.signal} in its smoke test ({result.last_step}); "
                    f"building {after} instead: {ba.LEVEL_WHY[after]}"
                )
        died = ", ".join(f"{level} ({mark.died[level].partition(' ')[0]})" for level, *_ in builds)
        self.say(
            f"Error: every llama.cpp build tried dies on this CPU in its smoke test: {died}; see "
            f"{self.mark_path}. Hint: ENGRAM_LLAMA_CPU=portable ./scripts/setup.sh forces the portable AVX2 build; "
            "on a CPU without AVX2 no build of this project runs"
        )
        return 1


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: install_llama.py VENV VERSION", file=sys.stderr)
        return 2
    venv, version = Path(argv[0]), argv[1]
    installer = Installer(venv, version, dict(os.environ), lambda line: print(line, file=sys.stderr, flush=True))
    return installer.run(lambda: run_smoke(venv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

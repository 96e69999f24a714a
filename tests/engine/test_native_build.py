"""Building the native library safely (engine/cpu/build.py): one compile among processes started at
once, no half-written or planted library loaded, a dead compile's leftovers removed, a cache directory
found where the home is read-only, the compiler's whole error kept, and clang refused in one line.

A two-line C file stands in for the kernels (the rules are the same, a compile takes milliseconds);
the real library goes through the same `build_library` (native.py), checked at the end."""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from itlbench.engine.cpu import build
from itlbench.engine.cpu.build import TMP_PREFIX, BuildError, build_library, cache_dir, find_compiler
from itlbench.system.cache import CACHE_ENV

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")

SOURCE = "int answer(void) { return 42; }\n"


def _compiler_script(tmp: Path, *, delay_s: float = 0.0) -> Path:
    """A compiler front that counts its runs in `runs`, waits `delay_s`, then runs gcc."""
    src = tmp / "answer.c"
    src.write_text(SOURCE)
    script = tmp / "cc.sh"
    script.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        echo run >> {tmp / "runs"}
        sleep {delay_s}
        exec gcc -O1 -fPIC -shared -o "$1" {src}
        """))
    script.chmod(0o755)
    return script


def _answer(path: Path) -> int:
    return ctypes.CDLL(str(path)).answer()


def _runs(tmp: Path) -> int:
    return len((tmp / "runs").read_text().splitlines()) if (tmp / "runs").exists() else 0


def _builder(tmp: Path, target: Path, script: Path) -> subprocess.Popen[str]:
    """Another process calling build_library on `target` and printing what it loaded."""
    code = (f"import ctypes; from pathlib import Path; from itlbench.engine.cpu.build import build_library\n"
            f"p = build_library(Path({str(target)!r}), lambda out: [{str(script)!r}, out])\n"
            f"print(ctypes.CDLL(str(p)).answer())")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, start_new_session=True)


def _kernels(tmp: Path) -> Path:
    out = tmp / "kernels"
    out.mkdir(mode=0o700)
    return out


def test_processes_started_at_once_compile_once(tmp_path: Path) -> None:
    target = _kernels(tmp_path) / "lib.so"
    script = _compiler_script(tmp_path, delay_s=1.0)  # long enough for all three to be waiting
    procs = [_builder(tmp_path, target, script) for _ in range(3)]
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err for _, err in outs]
    assert [out.strip() for out, _ in outs] == ["42"] * 3
    assert _runs(tmp_path) == 1, "the processes that waited on the lock loaded the first one's library"
    assert sorted(p.name for p in target.parent.iterdir()) == [".build.lock", "lib.so"], "no temp file left"


def test_killed_compile_leaves_no_library_and_its_temp_file_is_removed(tmp_path: Path) -> None:
    target = _kernels(tmp_path) / "lib.so"
    proc = _builder(tmp_path, target, _compiler_script(tmp_path, delay_s=30.0))
    deadline = time.monotonic() + 30
    while _runs(tmp_path) == 0 and time.monotonic() < deadline:  # the compile has started
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the builder and its compiler, midway
    proc.wait(timeout=10)
    left = list(target.parent.glob(TMP_PREFIX + "*"))
    assert left and not target.exists(), "a killed compile leaves its temp file, never the library"
    path = build_library(target, lambda out: [str(_compiler_script(tmp_path)), out])
    assert _answer(path) == 42
    assert not any(p.exists() for p in left), "the next compile removed the dead one's temp file"


@pytest.mark.parametrize("plant", ["group-writable", "symlink", "other-owner"])
def test_planted_library_is_not_loaded(tmp_path: Path, plant: str) -> None:
    target = _kernels(tmp_path) / "lib.so"
    evil = tmp_path / "evil.c"
    evil.write_text("int answer(void) { return 666; }\n")
    planted = tmp_path / "evil.so" if plant == "symlink" else target
    subprocess.run(["gcc", "-fPIC", "-shared", "-o", str(planted), str(evil)], check=True)
    if plant == "group-writable":
        target.chmod(0o775)
    elif plant == "symlink":
        target.symlink_to(planted)
    else:
        if os.getuid() != 0:
            pytest.skip("chown to another user needs root")
        os.chown(target, 65534, 65534)
    path = build_library(target, lambda out: [str(_compiler_script(tmp_path)), out])
    assert _runs(tmp_path) == 1 and _answer(path) == 42, "the planted file was compiled over, not loaded"
    assert build.untrusted(path) is None


def test_library_in_a_directory_others_can_write_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "shared"
    (root / "kernels").mkdir(parents=True)
    (root / "kernels").chmod(0o777)
    monkeypatch.setenv(CACHE_ENV, str(root))
    with pytest.raises(BuildError, match="lets group or others write it"):
        cache_dir()


def test_cache_falls_back_when_home_cache_is_not_writable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.setenv("HOME", str(blocker / "home"))  # ~/.cache cannot be created (even by root)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "itlbench"
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker / "xdg"))
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(temp))
    root = cache_dir()
    assert root == temp / f"itlbench-{os.getuid()}"
    assert (root.stat().st_mode & 0o777) == 0o700 and (root / "kernels").is_dir()


def test_planted_per_user_temp_directory_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if os.getuid() != 0:
        pytest.skip("chown to another user needs root")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(blocker / "home"))
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    planted = tmp_path / f"itlbench-{os.getuid()}"
    planted.mkdir(mode=0o700)
    os.chown(planted, 65534, 65534)
    with pytest.raises(BuildError, match="owned by uid 65534"):
        cache_dir()


def test_compile_error_keeps_the_whole_stderr(tmp_path: Path) -> None:
    src = tmp_path / "bad.c"
    src.write_text("int first(void) { return first_missing; }\nint f(void);\nint last(void) { return last_missing; }\n")
    target = _kernels(tmp_path) / "lib.so"
    with pytest.raises(BuildError) as err:
        build_library(target, lambda out: ["gcc", "-fPIC", "-shared", "-o", out, str(src)])
    assert "first_missing" in str(err.value) and "last_missing" in str(err.value)
    assert not target.exists() and not list(target.parent.glob(TMP_PREFIX + "*"))


def _fake_compiler(tmp: Path, banner: str) -> Path:
    cc = tmp / "fakecc"
    cc.write_text(f"#!/bin/sh\necho '{banner}'\n")
    cc.chmod(0o755)
    return cc


@pytest.mark.parametrize("banner", ["Ubuntu clang version 18.1.3 (1ubuntu1)", "tcc version 0.9.27"])
def test_compiler_other_than_gcc_is_refused_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       banner: str) -> None:
    monkeypatch.setenv("CC", str(_fake_compiler(tmp_path, banner)))
    with pytest.raises(BuildError) as err:
        find_compiler()
    assert "\n" not in str(err.value) and banner in str(err.value) and "CC=gcc" in str(err.value)


@pytest.mark.skipif(shutil.which("clang") is None, reason="clang is not installed")
def test_real_clang_is_refused_before_compiling(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from itlbench.engine.cpu import native

    monkeypatch.setenv("CC", "clang")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    kernel, why = native.build()
    assert kernel is None and why is not None and "clang" in why and "\n" not in why
    assert not list((tmp_path / "kernels").glob("*.so")), "nothing was compiled"


def test_native_build_reports_every_line_of_the_compilers_error(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from itlbench.engine.cpu import native

    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    kernel, why = native.build(variants=[["-fno-such-option-a", "-fno-such-option-b"]])
    assert kernel is None and why is not None
    assert "-fno-such-option-a" in why and "-fno-such-option-b" in why, why


def test_the_real_library_is_compiled_once_by_processes_started_at_once(tmp_path: Path) -> None:
    """Two processes load the native library from an empty cache at the same moment: one compile,
    and both load the same file. On x86 they build it for the x86-64 baseline (ITLBENCH_NATIVE_ARCH): the same
    sources through the same native.load, in about two thirds of the compile time of this CPU's own target."""
    log = tmp_path / "compiles"
    cc = tmp_path / "gcc-counting"
    cc.write_text(f'#!/bin/sh\n[ "$1" = --version ] || echo "$@" >> {log}\nexec gcc "$@"\n')
    cc.chmod(0o755)
    env = {**os.environ, "CC": str(cc), CACHE_ENV: str(tmp_path / "cache"), "ITLBENCH_NATIVE": "1",
           "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    env.pop("ITLBENCH_NATIVE_ARCH", None)
    if platform.machine() in ("x86_64", "AMD64"):
        env["ITLBENCH_NATIVE_ARCH"] = "x86-64"
    code = ("from itlbench.engine.cpu import native\n"
            "k = native.load()\n"
            "print(k.path if k else 'NONE ' + str(native.unavailable_reason()))")
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    paths = {out.strip() for out, _ in outs}
    assert len(paths) == 1 and not paths.pop().startswith("NONE"), outs
    assert len(log.read_text().splitlines()) == 1, "the second process waited and loaded the first one's build"
    assert f"-march={env.get('ITLBENCH_NATIVE_ARCH', 'native')} " in log.read_text()


STUB = ("int itl_paged_decode_f32(void) { return 0; }\nvoid itl_write_kv_f32(void) {}\n"
        "int itl_marker(void) { return MARK; }\n")


def _stub_gcc(tmp: Path) -> Path:
    """A GCC stand-in for native.py: answers `--version` as GCC and "compiles" a stub exporting the
    kernel's symbols and `itl_marker() == 42` (after $STUB_SLEEP seconds), counting runs in `runs`."""
    (tmp / "stub.c").write_text(STUB)
    cc = tmp / "stub-gcc"
    cc.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        if [ "$1" = --version ]; then echo "gcc (GCC) 99.0 stub"; echo "Free Software Foundation"; exit 0; fi
        echo run >> {tmp / "runs"}
        sleep "${{STUB_SLEEP:-0}}"
        while [ "$1" != -o ]; do shift; done
        exec gcc -fPIC -shared -DMARK=42 -o "$2" {tmp / "stub.c"}
        """))
    cc.chmod(0o755)
    return cc


def _native_in_child(env: dict[str, str]) -> subprocess.Popen[str]:
    """native.build() in a fresh process (a library already loaded here would be reused by name)."""
    code = ("from itlbench.engine.cpu import native\n"
            "k, why = native.build(variants=[[]])\n"
            "print(k.lib.itl_marker() if k else why)")
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**env, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
                            start_new_session=True)


def test_a_library_planted_where_native_loads_it_is_compiled_over(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: native.py loaded whatever file had the cache key's name (a group member's would run)."""
    from itlbench.engine.cpu import native

    monkeypatch.setenv("CC", str(_stub_gcc(tmp_path)))
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    kernel, why = native.build(variants=[[]])
    assert kernel is not None and kernel.lib.itl_marker() == 42, why
    evil = tmp_path / "evil.so"
    subprocess.run(["gcc", "-fPIC", "-shared", "-DMARK=666", "-o", str(evil), str(tmp_path / "stub.c")], check=True)
    os.replace(evil, kernel.path)  # a new inode: the copy mapped here stays intact
    kernel.path.chmod(0o775)  # as a group member could have left it
    out, err = _native_in_child(dict(os.environ)).communicate(timeout=120)
    assert out.strip() == "42", f"the planted library was loaded: {out!r} {err[-500:]}"
    assert _runs(tmp_path) == 2 and build.untrusted(kernel.path) is None


def test_a_killed_native_compile_leaves_nothing_after_the_next_build(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: a compile killed with SIGKILL left its `tmp*.so` in the cache for good."""
    from itlbench.engine.cpu import native

    monkeypatch.setenv("CC", str(_stub_gcc(tmp_path)))
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    proc = _native_in_child({**os.environ, "STUB_SLEEP": "30"})
    deadline = time.monotonic() + 60
    while _runs(tmp_path) == 0 and time.monotonic() < deadline:  # the compile has started
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    kernels = tmp_path / "cache" / "kernels"
    assert any(p.suffix == ".so" for p in kernels.iterdir()), "the killed compile left its temp file"
    kernel, why = native.build(variants=[[]])
    assert kernel is not None and kernel.lib.itl_marker() == 42, why
    left = sorted(p.name for p in kernels.iterdir() if p.name != build.LOCK_NAME)
    assert left == [kernel.path.name], f"a dead compile's leftovers remain: {left}"

"""The zygote: the process inside the sandbox that forks one child per call (standard library only).

This file is not imported by gradekit: its text is the ``-c`` program of every sandboxed worker,
so it runs under ``python -I -S`` with nothing but the standard library (and the packages a
grader declares) on its path. The host sends JSON lines on stdin; the zygote answers on a
private duplicate of stdout.

Why a zygote: the grader's code is loaded (imported) once, here; each call then runs in a
``fork`` of this warm process, so it costs a fork instead of an interpreter start, and anything
the call changes (a patched ``json.dumps``, a global, a file in its temp dir, a process it
left behind) dies with it. The zygote itself never runs a sample's code.

Why the result channel cannot be forged across samples: each call gets a new pipe, created just
before its fork and read only for that call. The child's harness writes one framed message
(a per-call random nonce, then the JSON result) after the user function returns. Anything else
on that pipe (a second message, bytes without the nonce) makes the call ``forged``, invalid.
The pipe to the host is closed in the child, and the zygote is not dumpable, so a sample can
neither write to it nor reopen it through ``/proc``.
"""

import contextlib
import ctypes
import gc
import io
import json
import math
import numbers
import os
import resource
import _signal
import select
import shutil
import signal
import sys
import time
import traceback

from _json import encode_basestring_ascii as _quote

# The harness in a call's child uses these references, taken before any user code runs: a
# sample that patches json.dumps, float, math.isfinite or numbers.Real changes its own module
# attributes, not what the harness already holds.
_float, _isinstance, _isfinite, _Real, _frepr, _write, _type = float, isinstance, math.isfinite, numbers.Real, float.__repr__, os.write, type

LOG_CHARS = 4000
MAX_RESULT = 1 << 20  # bytes read from a call's result channel; more is out of turn by definition
MAX_STDOUT = 1 << 20  # a program's stdout kept for comparison (code_tests)
# Fixed descriptor numbers, far above the ones a zygote uses, so that a child keeps what it needs
# and drops everything else with two close_range calls instead of a /proc listing.
RESULT_FD, REQUEST_FD, DEVNULL_FD = 1000, 1001, 1002


class _Tail(io.TextIOBase):
    """print() output of the call: only the last LOG_CHARS characters are kept, so printing
    gigabytes costs time, never memory."""

    def __init__(self):
        self.text = ""

    def writable(self):
        return True

    def write(self, s):
        self.text = (self.text + str(s))[-LOG_CHARS:]
        return len(s)


def _encode(reply):
    """The reply as JSON from primitives taken at import (see above), not through the json module."""
    parts = []
    for key, value in reply.items():
        if value is True or value is False:
            text = "true" if value else "false"
        elif value is None:
            text = "null"
        elif _type(value) is float:
            text = _frepr(value)
        else:
            text = _quote(value if _type(value) is str else "%s" % (value,))
        parts.append(_quote(key) + ": " + text)
    return "{" + ", ".join(parts) + "}"


def _well_formed(reply):
    """The shape the harness writes: a planted frame (a nonce dug out of memory) gets no further."""
    if type(reply) is not dict or not all(type(reply.get(key, "")) is str for key in ("logs", "error", "kind", "stdout")):
        return False
    if reply.get("ok") is True:
        return "value" not in reply or (type(reply["value"]) in (int, float) and math.isfinite(reply["value"]))
    return reply.get("ok") is False


def _remove(path, is_dir):
    """Remove a file or a folder tree; an empty folder (the usual temp dir) costs one rmdir."""
    try:
        if is_dir:
            os.rmdir(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError:
        shutil.rmtree(path, ignore_errors=True)


def _describe(exc, filename):
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == filename]
    where = f" (line {frames[-1].lineno}, in {frames[-1].name})" if frames else ""
    if isinstance(exc, SyntaxError) and exc.filename == filename:
        where = f" (line {exc.lineno})"
    text = str(exc) if not isinstance(exc, SyntaxError) else (exc.msg or "")
    return f"{type(exc).__name__}{': ' + text if text else ''}{where}"


class Zygote:
    def __init__(self, settings):
        self.isolated = settings["isolated"]  # inside bubblewrap's pid namespace: kill(-1) is ours alone
        self.limits = settings["limits"]
        self.scratch = settings["scratch"]  # where per-call temp dirs are made
        self.wipe = settings.get("wipe", [])  # writable places emptied after every call (sandbox tmpfs)
        self.keep = set(settings.get("keep", []))  # their entries that are read-only binds (a venv under /tmp): left as they are
        self.env = settings.get("env", {})
        self.cpus = settings.get("cpus")
        self.fn = None
        self.filename = "<grader>"
        self.load_error = None
        # One temp dir path for every call, emptied and made again between calls: the
        # environment (HOME, TMPDIR) is then set once here rather than in every child.
        self.home = os.path.join(self.scratch, "call" if self.isolated else f"call-{os.getpid()}")
        self.fresh = False  # the temp dir exists and is empty, ready for the next call
        self.ready = None  # the next call's child, forked ahead and waiting for its arguments
        self.call_timeout = None
        self.raw = None  # the last verdict's JSON line as the child wrote it, when well formed
        self.finishing = None  # a call answered early whose child is still to be reaped (see settle)
        # The environment every call gets, set here once so that a child only adds HOME and TMPDIR.
        os.environ.clear()
        os.environ.update(self.env)
        os.environ["HOME"] = os.environ["TMPDIR"] = self.home
        os.dup2(os.open(os.devnull, os.O_RDWR), DEVNULL_FD)
        libc = ctypes.CDLL(None, use_errno=True)
        self.libc = libc
        # The zygote is pid 1 of its namespace (bubblewrap's --as-pid-1, or unshare without bubblewrap),
        # which no process of that namespace can signal unless it installs a handler (it installs none
        # that matters: SIGINT goes back to the default); an old bubblewrap makes it pid 2 under bwrap.
        if self.isolated and os.getpid() != 1 and (os.getpid() != 2 or os.getppid() != 1):
            # kill(-1) outside our own pid namespace would hit every process of this user.
            raise SystemExit("gradekit zygote: not in a fresh pid namespace; refusing to run isolated")
        if os.getpid() == 1:
            _signal.signal(_signal.SIGINT, _signal.SIG_DFL)
        with contextlib.suppress(Exception):
            libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: children of ours cannot ptrace us or read /proc/<us>/fd, mem
        with contextlib.suppress(Exception):
            libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS: no setuid binary gains anything
        if not self.isolated:
            with contextlib.suppress(Exception):
                libc.prctl(1, 9)  # PR_SET_PDEATHSIG SIGKILL: do not outlive the grader
            if os.getppid() != settings["parent"]:
                os._exit(0)

    # ---- loading ------------------------------------------------------------------------------

    def freeze(self):
        """After loading: what the zygote holds moves to the collector's permanent generation, so a
        collection in a child never walks (and writes the headers of) the zygote's objects,
        which would copy their pages (copy-on-write) in every child."""
        gc.collect()
        gc.freeze()

    def load(self, msg):
        for module in msg.get("preload", []):
            with contextlib.suppress(Exception):
                __import__(module)
        self.call_timeout = msg.get("timeout")
        if msg.get("source") is None:
            self.freeze()
            return {"ok": True, "pid": os.getpid()}
        self.filename = msg["filename"]
        namespace = {"__name__": "__gradekit_grader__", "__file__": self.filename}
        logs = _Tail()
        try:
            with contextlib.redirect_stdout(logs), contextlib.redirect_stderr(logs):
                exec(compile(msg["source"], self.filename, "exec"), namespace)
            self.fn = namespace.get(msg["entry"])
            if not callable(self.fn):
                self.load_error = f"{self.filename} defines no function {msg['entry']!r}"
        except BaseException as e:  # noqa: BLE001 - user code may raise anything, SystemExit included
            self.load_error = f"loading {self.filename} failed: {_describe(e, self.filename)}"
            if isinstance(e, ModuleNotFoundError):
                self.load_error += "; declare the package in the grader's packages: list"
        self.freeze()
        return {"ok": self.load_error is None, "error": self.load_error, "pid": os.getpid()}

    # ---- one forked call ----------------------------------------------------------------------

    def _child_setup(self, result_w, stdin_fd, stdout_fd, timeout, keep=None):
        """In the forked child, before any user code: limits, a private temp dir, fds."""
        os.setsid()  # its own process group: the plain mode kills the group after the call
        with contextlib.suppress(Exception):
            self.libc.prctl(4, 1, 0, 0, 0)  # dumpable again: its own /proc files are its own; the zygote stays closed
        if not self.isolated:  # no pid namespace to take it down: die with the zygote at least
            with contextlib.suppress(Exception):
                self.libc.prctl(1, 9)
        _signal.signal(_signal.SIGPIPE, _signal.SIG_DFL)  # _signal: no enum conversion, fewer pages touched
        _signal.signal(_signal.SIGXFSZ, _signal.SIG_IGN)  # a write past the file size cap fails instead of killing
        os.dup2(stdin_fd if stdin_fd is not None else DEVNULL_FD, 0)
        os.dup2(stdout_fd if stdout_fd is not None else DEVNULL_FD, 1)
        os.dup2(DEVNULL_FD, 2)
        # The host pipes, the zygote's reply fd and every other call's pipes: gone. Only the
        # result fd (RESULT_FD) and this call's request pipe (REQUEST_FD) stay.
        os.closerange(3, RESULT_FD)
        os.closerange(REQUEST_FD + 1 if keep is not None else REQUEST_FD, 1 << 20)
        limits = self.limits
        cap = limits.get("memory")
        if cap:
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        cpu = max(1, math.ceil(timeout)) + 1  # a backstop for the wall-clock timeout: CPU spent in any thread
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        if limits.get("processes"):
            n = limits["processes"]
            resource.setrlimit(resource.RLIMIT_NPROC, (n, n))
        if limits.get("file_size"):
            n = limits["file_size"]
            resource.setrlimit(resource.RLIMIT_FSIZE, (n, n))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.chdir(self.home)
        if self.cpus:  # one CPU per call; the zygote itself floats, so this setup runs on any free CPU
            os.sched_setaffinity(0, self.cpus)

    def _start(self, body, timeout, stdin=None, capture=False, deferred=False):
        """Fork a child that will run body(input). With ``deferred`` the child first blocks until
        its input arrives on a pipe: forked ahead, it is a sleeping process that a request wakes,
        which the scheduler serves at once, where a brand-new process queues behind every busy one."""
        if not self.fresh:
            self.prepare()
        self.fresh = False  # this call's from now on
        nonce = os.urandom(16).hex()
        result_r, result_w = os.pipe()
        out_r = out_w = in_fd = req_r = req_w = None
        if capture:
            out_r, out_w = os.pipe()
        if stdin is not None:
            in_fd = os.memfd_create("stdin")
            os.write(in_fd, stdin.encode("utf-8"))
            os.lseek(in_fd, 0, os.SEEK_SET)
        if deferred:
            req_r, req_w = os.pipe()
            os.dup2(req_r, REQUEST_FD)
            os.close(req_r)
            req_r = REQUEST_FD
        os.dup2(result_w, RESULT_FD)
        os.close(result_w)
        result_w = RESULT_FD
        pid = os.fork()
        if pid == 0:
            code = 70
            try:
                self._child_setup(result_w, in_fd, out_w, timeout, keep=req_r)
                data = None
                if req_r is not None:
                    # One JSON line: read up to its newline rather than its EOF, which would cost a
                    # second wake-up (the zygote closes its end just after writing).
                    chunks = [os.read(req_r, 1 << 16)]
                    while chunks[-1] and not chunks[-1].endswith(b"\n"):
                        chunks.append(os.read(req_r, 1 << 16))
                    os.close(req_r)
                    data = b"".join(chunks)
                reply = body(data)
                data = (nonce + "\n" + _encode(reply) + "\n").encode("utf-8")
                while data:
                    data = data[_write(result_w, data):]
                code = 0
            finally:
                os._exit(code)
        for fd in (result_w, out_w, in_fd, req_r):
            if fd is not None:
                os.close(fd)
        return {"pid": pid, "nonce": nonce, "result": result_r, "out": out_r, "request": req_w, "timeout": timeout}

    def _finish(self, started, exit_ok=False, early=False):
        """Wait for a started child (up to its timeout), clean up after it, and judge what it sent.

        With ``early`` the verdict is given as soon as the result channel holds a whole frame
        (or bytes that can never become the call's own frame): the harness writes its frame
        last and then exits, so nothing the child could still do changes the verdict. Its
        exit, the kill of everything it left and the clean-up then happen in :meth:`settle`,
        after the reply is out but before the next call's child exists.
        """
        pid, nonce, result_r, out_r, timeout = started["pid"], started["nonce"], started["result"], started["out"], started["timeout"]
        pidfd = os.pidfd_open(pid)
        result, stdout = bytearray(), bytearray()
        readers = {result_r: (result, MAX_RESULT)}
        if out_r is not None:
            readers[out_r] = (stdout, MAX_STDOUT)
        deadline = time.monotonic() + timeout
        status = None
        expected = nonce.encode() + b"\n"
        while status is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            ready, _, _ = select.select([pidfd, *readers], [], [], remaining)
            for fd in ready:
                if fd == pidfd:
                    status = os.waitpid(pid, 0)[1]
                else:
                    self._read(fd, readers)
            if early and status is None and (result.count(b"\n") >= 2 or not expected.startswith(bytes(result[:len(expected)]))):
                self.finishing = (pid, pidfd, result_r)
                return self._verdict(bytes(result), nonce, 0, False, timeout), b""
        timed_out = status is None
        if timed_out:
            os.kill(pid, signal.SIGKILL)
            status = os.waitpid(pid, 0)[1]
        self._cleanup(pid)
        for fd in list(readers):  # whatever is left, now that every writer is dead (or detached, plain mode)
            os.set_blocking(fd, False)
            while fd in readers and self._read(fd, readers):
                pass
        for fd in (pidfd, result_r, out_r):
            if fd is not None:
                os.close(fd)
        if exit_ok and not result and not timed_out and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
            # A stdin/stdout program that ended itself with os._exit(0): its output is what is judged.
            return {"ok": True}, bytes(stdout)
        return self._verdict(bytes(result), nonce, status, timed_out, timeout), bytes(stdout)

    def _fork(self, body, timeout, stdin=None, capture=False, exit_ok=False):
        """Run body() in a new forked child; return (its verdict, its stdout)."""
        return self._finish(self._start(lambda _: body(), timeout, stdin=stdin, capture=capture), exit_ok=exit_ok)

    @staticmethod
    def _read(fd, readers):
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return False
        buffer, cap = readers[fd]
        if not chunk:
            del readers[fd]
            return False
        if len(buffer) < cap:
            buffer += chunk[: cap - len(buffer)]
        return True

    def _verdict(self, data, nonce, status, timed_out, timeout):
        if timed_out:
            return {"ok": False, "kind": "timeout", "error": f"timed out after {timeout:g} s; every process of the call was killed"}
        expected = nonce.encode() + b"\n"
        if data.startswith(expected) and data.count(b"\n") == 2 and data.endswith(b"\n") and status == 0:
            try:
                reply = json.loads(data[len(expected):])
            except ValueError:
                reply = None
            if _well_formed(reply):
                self.raw = data[len(expected):]  # forwarded as it is: no second encoding
                return reply
            # The harness writes a well-formed reply: anything else in its frame was planted.
            return {"ok": False, "kind": "forged", "error": "the result channel held a damaged frame; the result is void"}
        if data and not (data.startswith(expected) and data.count(b"\n") == 2 and data.endswith(b"\n")):
            return {"ok": False, "kind": "forged",
                    "error": "the sample wrote to the result channel out of turn; its result is void"}
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
            why = {"SIGXCPU": f" (CPU time limit {max(1, math.ceil(timeout)) + 1} s)", "SIGKILL": " (memory or a kill)"}.get(name, "")
            return {"ok": False, "kind": "crashed", "error": f"the call was killed by {name}{why}"}
        code = os.waitstatus_to_exitcode(status)
        if code == 70:
            return {"ok": False, "kind": "crashed", "error": "the call could not be set up in the sandbox"}
        return {"ok": False, "kind": "crashed", "error": f"the call exited with code {code} before returning a result"}

    def settle(self):
        """The rest of a call answered early: its child dies (it is exiting anyway), is reaped,
        and nothing it started survives; whatever it wrote after its frame is dropped."""
        if self.finishing is None:
            return
        pid, pidfd, result_r = self.finishing
        self.finishing = None
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        self._cleanup(pid)
        os.close(pidfd)
        os.close(result_r)

    def _cleanup(self, pid):
        """No process of the call survives it (its files and IPC objects go in :meth:`tidy`)."""
        if self.isolated:
            # Our own pid namespace: everyone but pid 1 (bubblewrap, or us) and us is the call's. A kill
            # is asynchronous and orphans are reaped by pid 1, so wait until they are gone from
            # /proc: the next call must not even see them (a quick listing when nothing was left).
            me = str(os.getpid())
            for attempt in range(4000):
                try:
                    os.kill(-1, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self._reap()
                left = [p for p in os.listdir("/proc") if p.isdigit() and p not in ("1", me)]
                if not left:
                    break
                time.sleep(0.0005 if attempt < 1000 else 0.005)
        else:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        self._reap()

    @staticmethod
    def _reap():
        while True:  # what was ours (the call's child); orphans are pid 1's
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break

    def prepare(self):
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.home, 0o700)
        self.fresh = True

    def tidy(self):
        """After the reply is out (off the caller's clock): the last call's processes, files and
        IPC objects go, and the next call's temp dir is made. The next call's child is forked
        only after this (:meth:`prefork`), so it never coexists with anything of the last call."""
        self.settle()
        if self.isolated:
            self.fresh = False  # the wipe takes the temp dir with it
            self._remove_ipc()
            for place in self.wipe:
                with contextlib.suppress(OSError), os.scandir(place) as entries:
                    for entry in entries:
                        if entry.path not in self.keep:
                            _remove(entry.path, entry.is_dir(follow_symlinks=False))
        else:
            if not self.fresh:
                _remove(self.home, True)
        if not self.fresh:
            self.prepare()

    def _remove_ipc(self):
        # System V objects live as long as the IPC namespace (the sandbox), not the process.
        # Read with os.read, not open(): a text file object per call touches many pages, and
        # every page the zygote touches is copied again after the next fork.
        for kind in ("shm", "sem", "msg"):
            try:
                fd = os.open(f"/proc/sysvipc/{kind}", os.O_RDONLY)
            except OSError:
                continue
            try:
                chunks = [os.read(fd, 1 << 16)]
                while chunks[-1]:
                    chunks.append(os.read(fd, 1 << 16))
            except OSError:
                chunks = []
            finally:
                os.close(fd)
            rows = b"".join(chunks).splitlines()[1:]
            if not rows:
                continue
            rmid = {"shm": lambda i: self.libc.shmctl(i, 0, None), "sem": lambda i: self.libc.semctl(i, 0, 0),
                    "msg": lambda i: self.libc.msgctl(i, 0, None)}[kind]
            for row in rows:
                fields = row.split()
                if len(fields) > 1:
                    rmid(int(fields[1]))

    # ---- the two operations -------------------------------------------------------------------

    def call(self, msg, line):
        if self.load_error is not None:
            return {"ok": False, "kind": "load", "error": self.load_error}
        self.raw = None
        started, self.ready = self.ready, None
        if started is not None and started["timeout"] != msg["timeout"]:
            self._discard_ready(started)
            started = None
        if started is None:
            started = self._start(self._call_body, msg["timeout"], deferred=True)
        try:
            data = line
            while data:
                data = data[os.write(started["request"], data):]
        except OSError:
            pass  # it died waiting: _finish says how
        os.close(started["request"])
        reply, _ = self._finish(started, early=True)
        raw, self.raw = self.raw, None
        return raw if raw is not None else reply

    def prefork(self):
        """The next call's child, forked now, off the caller's clock (python grader only)."""
        if self.fn is not None and self.ready is None and self.call_timeout:
            self.ready = self._start(self._call_body, self.call_timeout, deferred=True)

    def _discard_ready(self, started):
        with contextlib.suppress(OSError):
            os.kill(started["pid"], signal.SIGKILL)
        os.waitpid(started["pid"], 0)
        for fd in (started["request"], started["result"]):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _call_body(self, data):
        fn, filename, cap = self.fn, self.filename, self.limits.get("memory") or 0
        args = json.loads(data)["args"]
        logs = _Tail()
        out_of_memory = False
        sys.stdout = sys.stderr = logs  # this process ends with the call: nothing to restore
        try:
            value = fn(*args)
            if hasattr(value, "__await__"):
                import asyncio

                async def wait():
                    return await value

                value = asyncio.run(wait())
            if _isinstance(value, bool) or not _isinstance(value, _Real):
                shown = repr(value)
                reply = {"ok": False, "kind": "not_a_number",
                         "error": f"returned {type(value).__name__} {shown[:80]}{'...' if len(shown) > 80 else ''}, not a number"}
            elif not _isfinite(_float(value)):
                reply = {"ok": False, "kind": "not_a_number", "error": f"returned {_float(value)}, not a finite number"}
            else:
                reply = {"ok": True, "value": _float(value)}
        except MemoryError:
            out_of_memory = True  # the reply is built once the hog's frames are gone
        except BaseException as e:  # noqa: BLE001
            reply = {"ok": False, "kind": "exception", "error": _describe(e, filename)}
        if out_of_memory:
            reply = {"ok": False, "kind": "memory", "error": f"MemoryError: the grader exceeded its memory cap of {cap // 2**20} MiB"}
        reply["logs"] = logs.text
        return reply

    def run(self, msg):
        """code_tests: one program, several cases, each in its own forked child."""
        program, cases, results = msg["program"], msg["cases"], []
        try:
            compile(program, "<program>", "exec")
        except (SyntaxError, ValueError) as e:
            error = _describe(e, "<program>") if isinstance(e, SyntaxError) else f"{type(e).__name__}: {e}"
            return {"compile_error": error}
        for case in cases:
            tests = case.get("tests")
            # Assert-style: the case passes only if the appended tests ran to their end, not if the
            # program left early with sys.exit(0) or os._exit(0).
            done = "_gradekit_done_" + os.urandom(8).hex()
            source = program if not tests else program + "\n\n" + tests + f"\n{done} = True\n"

            def body(source=source, tests=tests, done=done):
                try:
                    code = compile(source, "<program>", "exec")
                    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding="utf-8")
                    sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)), encoding="utf-8")
                    sys.stderr = open(os.devnull, "w")
                    sys.argv = ["<program>"]
                    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
                    try:
                        exec(code, namespace)
                    finally:
                        with contextlib.suppress(Exception):
                            sys.stdout.flush()
                    if tests and namespace.get(done) is not True:
                        return {"ok": False, "error": "the tests did not run to their end"}
                    return {"ok": True}
                except SystemExit as e:
                    if tests:
                        return {"ok": False, "error": f"exited (code {e.code}) before its tests ran to their end"}
                    if e.code in (None, 0):
                        return {"ok": True}
                    return {"ok": False, "error": f"exited with code {e.code}"}
                except MemoryError:
                    return {"ok": False, "error": "MemoryError: over the memory cap"}
                except BaseException as e:  # noqa: BLE001
                    return {"ok": False, "error": _describe(e, "<program>")}

            if results:
                self.tidy()  # each case starts from a clean sandbox, as if it were the first
            reply, stdout = self._fork(body, msg["timeout"], stdin=case.get("stdin") or "", capture=True,
                                       exit_ok=not tests)
            reply["stdout"] = stdout.decode("utf-8", "replace")
            results.append(reply)
        return {"cases": results}


class _Requests:
    """The host's requests, read into one reused buffer that is zeroed as each request is consumed.

    A call's arguments never become an object of the zygote: the request line is forwarded to the
    call's child from this buffer and wiped, and whatever else a request made (its header, a
    code_tests program and its cases, the reply) lives in the frame of :func:`_handle`, which
    returns before the next call's child is forked. A later call therefore finds no earlier
    sample's data among the objects it inherits (``gc.get_objects()``, frames).
    """

    def __init__(self, fd):
        self.fd = fd
        self.buf = bytearray(1 << 16)
        self.n = 0

    def line(self):
        """The next line (with its newline) as a view into the buffer; None at the end of input."""
        start = 0
        while True:
            i = self.buf.find(b"\n", start, self.n)
            if i >= 0:
                return memoryview(self.buf)[: i + 1]
            start = self.n
            if self.n == len(self.buf):
                grown = bytearray(2 * len(self.buf))
                grown[: self.n] = self.buf
                self.buf[:] = bytes(len(self.buf))
                self.buf = grown
            with memoryview(self.buf) as view:
                got = os.readv(self.fd, [view[self.n:]])
            if not got:
                return None
            self.n += got

    def consume(self, view):
        """Drop a line returned by :meth:`line` and zero its bytes."""
        k = len(view)
        view.release()
        rest = self.n - k
        self.buf[:rest] = self.buf[k:self.n]
        self.buf[rest:self.n] = bytes(k)
        self.n = rest


def _handle(zygote, requests, reply_to):
    """One request, answered; every reference to its data dies with this frame, before the next fork."""
    header = requests.line()
    if header is None:
        return False
    msg = json.loads(bytes(header))  # a call's header holds its op and timeout only; its arguments follow
    requests.consume(header)
    op = msg["op"]
    if op == "call":
        payload = requests.line()
        if payload is None:
            return False
        try:
            reply = zygote.call(msg, payload)
        finally:
            requests.consume(payload)
    else:
        reply = zygote.load(msg) if op == "load" else zygote.run(msg)
    data = reply if type(reply) is bytes else (json.dumps(reply) + "\n").encode("utf-8")
    while data:
        data = data[os.write(reply_to, data):]
    return True


def main():
    settings = json.loads(sys.argv[1])
    reply_to = os.dup(1)  # written with os.write: no file object (fewer pages touched per call)
    os.dup2(2, 1)  # anything on fd 1 from now on goes to stderr (discarded), never into the protocol
    zygote = Zygote(settings)
    del settings
    requests = _Requests(0)
    while _handle(zygote, requests, reply_to):
        zygote.tidy()
        zygote.prefork()


if __name__ == "__main__":
    main()

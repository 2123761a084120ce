"""The watchdog of a local Ray cluster a run started: the cluster ends with the run, however the run ends.

``gradekit grade --ray local`` starts a cluster inside the driver (``ray.init(address="local")``). On a clean
exit ``ray.shutdown()`` stops it, but a driver killed with SIGKILL (or OOM-killed) cannot: Ray's GCS and
raylet follow their parent, the agents the raylet started do not, and stayed running. This program is started
beside the cluster, with its own session (so no signal to the driver's group reaches it), holding the read end
of a pipe whose write end only the driver holds. When the driver is gone, whatever the cause, the read sees the
end of the pipe, and the watchdog kills every process of that cluster: those naming its session folder, those
its raylets started (``RAY_RAYLET_PID``), and Ray workers writing into its logs. It runs as
``python -I -S -c SOURCE SESSION_DIR FD`` (standard library only, Linux's /proc).
"""

import os
import signal
import sys
import time


def _read(path):
    with open(path, "rb") as handle:
        return handle.read()


def _raylets(session):
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = _read(f"/proc/{entry}/cmdline").split(b"\0")
            except OSError:
                continue
            if argv and os.path.basename(argv[0]) == b"raylet" and session.encode() in b" ".join(argv):
                found.add(entry)
    return found


def members(session, raylets):
    """The pids of the cluster's processes still running (never this one)."""
    mine, pids = str(os.getpid()), []
    marks = [f"RAY_RAYLET_PID={r}".encode() for r in raylets]
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or entry == mine:
            continue
        try:
            cmdline = _read(f"/proc/{entry}/cmdline").replace(b"\0", b" ").decode(errors="replace")
            if session in cmdline:
                pids.append(int(entry))
                continue
            environ = _read(f"/proc/{entry}/environ").split(b"\0")
            if any(mark in environ for mark in marks):
                pids.append(int(entry))
                continue
            if cmdline.startswith("ray::") and any(os.readlink(f"/proc/{entry}/fd/{fd}").startswith(session)
                                                   for fd in os.listdir(f"/proc/{entry}/fd")):
                pids.append(int(entry))
        except OSError:
            continue  # gone meanwhile, or not ours to read
    return pids


def main(session, fd):
    raylets = _raylets(session)  # while the cluster runs: its raylet's pid marks what the raylet starts
    try:
        while os.read(fd, 4096):
            pass
    except OSError:
        pass
    raylets |= _raylets(session)
    for _ in range(20):  # a raylet may start a process while it is being stopped: look again until none is left
        pids = members(session, raylets)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.5)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))

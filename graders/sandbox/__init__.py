"""Where untrusted code runs: the bubblewrap policy, the zygote and the worker pool.

The ``python`` and ``code_tests`` graders (in :mod:`graders`) hand their code to a
:class:`ZygotePool`; the pool starts zygotes (:mod:`._zygote`, the program that forks one child
per call) under the isolation :func:`resolve` picks for the ``sandbox:`` policy
(:mod:`._policy`). Nothing here knows about samples or grades: it runs code and returns what
the code's harness reported. Standard library only, so importing it costs nothing.
"""

from ._policy import Isolation, Policy, SandboxUnavailable, SandboxWarning, probe, resolve
from ._pool import BACKSTOP, DEFAULT_CPUS, DEFAULT_FILE_MB, DEFAULT_PROCESSES, Limits, ZygotePool

__all__ = ["BACKSTOP", "DEFAULT_CPUS", "DEFAULT_FILE_MB", "DEFAULT_PROCESSES", "Isolation", "Limits", "Policy",
           "SandboxUnavailable", "SandboxWarning", "ZygotePool", "probe", "resolve"]

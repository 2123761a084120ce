"""gradekit: LLM-as-judge graders that turn model outputs into rewards.

The judge core is :mod:`gradekit.judge` (rubrics, the Judge client, verdicts); the graders, runs,
calibration and front doors are :mod:`gradekit.graders`; the fake provider for tests is
:mod:`gradekit.judge.testing`. ``python -m gradekit`` runs the command line.
"""

from gradekit._version import __version__

__all__ = ["__version__"]

"""`python -m gradekit` runs the gradekit CLI (same as the `gradekit` script)."""

from gradekit.graders.cli import main

main()

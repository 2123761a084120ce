"""`python -m graders` runs the gradekit CLI (same as the `gradekit` script)."""

from graders.cli import main

main()

"""`python -m graders` runs the gradekit CLI (same as the `gradekit` script)."""

from graders._cli import main

main()

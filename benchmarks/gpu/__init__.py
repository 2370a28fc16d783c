"""The GPU kit: steps.py runs its steps, measure.py holds the model steps, record.py keeps the run record."""

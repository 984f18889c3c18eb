"""What a generation reports: the counters and the result record (generation.py) and the
statistics table that names every field once and generates each output from it (table.py)."""
from .generation import GenerationResult, GenerationStats, StepOutcome

__all__ = ["GenerationResult", "GenerationStats", "StepOutcome"]

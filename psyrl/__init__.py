"""psyrl: a from-scratch T-GRPO trainer for psychological reasoning ("From Stimuli to Minds")."""

__version__ = "0.1.0"

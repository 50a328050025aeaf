"""Accuracy signals beyond the paper's token F1 (issue 41), and the audit that checks one."""

"""Kernel benchmark cases, one module per op family (each defines CASES); see common.py."""

"""Declarations: `Study`, searches, tours, base recipes and profiles: what an `ablations/` file imports."""

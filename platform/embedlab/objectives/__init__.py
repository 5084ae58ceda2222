"""Library: the losses as pure tensor functions that return a sum and a count, and their distributed
plumbing (gathers, GradCache). Imports with torch alone."""

"""A class graded: here, in parallel, on Dask and Gradescope; feedback, export, reports, similarity."""

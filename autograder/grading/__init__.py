"""A class's grading and what is made of it: the run over every submission (here, on a Dask
cluster, on Gradescope), the runs' registry, collecting, feedback, the export, the class report and
the similarity report. It runs each notebook through :mod:`autograder.engine`."""

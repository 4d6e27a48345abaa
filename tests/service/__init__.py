"""The grading service and the class's JupyterHub."""

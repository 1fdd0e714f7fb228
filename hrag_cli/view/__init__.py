"""`hrag view`: the graph as one self-contained HTML page."""

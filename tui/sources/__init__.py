"""Where the UI's messages come from: a live run (`connection`, its receive thread; `feeds`, how the
app takes the batches in), a recorded one (`replay`), and how silent ranks ended (`exit_probe`)."""

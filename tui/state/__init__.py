"""The run's state: protocol messages folded into one snapshot (`view_model.RunView`), with its
parts (`reducers/`), the per-node fold (`nodes`), the marks of ranks in trouble (`marks`), the
health line's readings (`health`) and the pipeline steps (`pipeline`). Tabs read it; it reads no tab."""

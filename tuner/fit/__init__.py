"""Fitting and checking the cost model against measured rows: the one place that reads
leaderboards for the estimator.

- `validate`: measured rows (ours, the reference CSVs) as cases, predicted and compared;
- `calibrate`: the Profile's constants fitted to measured phase times;
- `memory`: the memory model's correction and headroom fitted to measured peaks;
- `leaderboards`: `tune calibrate`'s reading, fitting and saving;
- `online`: what a running study learns from its own trials (time scales, the memory guard);
- `notes`: facts about single files and rows, read from the `fit.toml` beside them.

`tuner.estimate` (the model itself) imports nothing from here and reads no CSV.
"""

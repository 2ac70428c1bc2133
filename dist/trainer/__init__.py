"""The main job as a package: scripts/train.py, generate.py, export.py and prepare_data.py
run `main(argv)` of `main`, `generate`, `export` and `prepare_data`; beside them the
options (`options`), the data (`data`), what a run reports (`progress`, `plotting`) and
the CUDA-graph step (`graph_step`). Nothing is imported here: `import dist` stays light."""

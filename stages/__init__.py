"""One thin CLI per DVC stage (dvc.yaml): parse arguments and params, call structinit, write outputs.

params.yaml is checked against its schema once, by the first stage (check_params), which every
other stage depends on; a stage reads the file as it is (structinit.pipeline.load.load_params).
"""

"""Data for training, and the CPU-side commands that get it ready.

    __main__   python -m resilient_slurm.data tokenize | prepare (tokens/tokenize_files.py, tokens/prepare.py)

Sub-packages:
    tokens/    pretraining on token corpora: Megatron .bin/.idx and token arrays read in place, a
               weighted mixture in tokens, the order prepared ahead, the data position and phases
"""

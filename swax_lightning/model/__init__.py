"""The model layer: plain single-device PyTorch (torchtitan's rule). ModelConfig and the table of layer letters,
the layers (sliding-window attention, mLSTM, Gated DeltaNet) and their building blocks, SWAXModel, the decode caches
and the streaming inference over them, and the Hugging Face wrapper of an exported model. Kernels come from
swax_lightning.kernels; nothing here imports Lightning, jsonargparse, the data or the training code."""

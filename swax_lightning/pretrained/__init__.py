"""Pretrained models: import from Hugging Face folders and GGUF files, LoRA, the retrofit into linear attention
(attention transfer, then LoRA), and the companion comparison experiment with its report."""

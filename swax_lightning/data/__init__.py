"""The data layer: corpora, tokenizers, litdata shards (local or object store), the generated recall documents and
their context-only marks, and the LightningDataModule that serves training, validation and test blocks. It does not
import the model."""

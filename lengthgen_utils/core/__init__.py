"""The book's model code: tasks, position encodings, RoPE's numerics, attention, and the models.

* :mod:`.tasks`: the tasks behind one protocol (fixed-offset retrieval, delayed copy, ...);
* :mod:`.rope`: RoPE's rotation, its angles and the offset kernel's features, written once;
* :mod:`.encodings`: position encodings as objects behind one interface, and a registry;
* :mod:`.attention`: masks, scores and normalisers;
* :mod:`.models`: the readable models (the retrieval head, the kernel head, a linear RNN, a nanoGPT-shaped
  transformer), every parameter with a leading ensemble dimension; :class:`.models.Transformer` is the
  transformer to read;
* :mod:`.fast`: :class:`.fast.FastTransformer`, the same transformer (same state dict) in a batched layout,
  tested equal to :class:`.models.Transformer` (logits, loss and gradients, on every encoding): the one the
  book trains.
"""

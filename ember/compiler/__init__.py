"""The compiler's wiring: the static pipeline (``driver``), the VM compiler (``vm`` and its
``vm_*`` parts), measurement and schedule choice (``tuning``, ``autosched``), and the entry
point ``api.compile``. Nothing on the runtime side (``runtime``, ``vm``) imports this package,
so a saved model loads without it."""

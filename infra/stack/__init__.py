"""The Pulumi program: settings (declared once), the validated config, every node's boot data,
the ``LlamaRpcCluster`` component, and ``backends/`` (each cloud's Pulumi resources). Importing
this package, ``settings`` or ``config`` pulls in no provider SDK."""

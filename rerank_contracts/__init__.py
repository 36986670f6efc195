"""What the project's processes exchange, owned by none of them (standard library only).

The operator, the quantization Job, the quality guard, the activator and the pools' fetch init container each import
these modules and never each other:

- :mod:`.artifact_layout`: where an artifact lives on the model volume and what its directory holds;
- :mod:`.quantize_job`: the Job's command line (the request) and its termination message (the result), the quality
  gate's defaults;
- :mod:`.guard`: the quality guard's configuration, as the operator writes it and the guard reads it;
- :mod:`.activator`: the headers, token and paths between a model's route, the activator and the operator;
- :mod:`.oci` and :mod:`.shared_store`: the shared artifact store (an OCI registry) that the Job pushes to and the
  pools' init container (``rerank-fetch-artifact``) fetches from, verified file by file.
"""

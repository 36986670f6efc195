"""hack/rerank_devcluster/: the dev cluster harness's pure parts (ports, images, releases, node reaping)."""

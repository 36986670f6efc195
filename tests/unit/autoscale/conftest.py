import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # autoscale_helpers.py
sys.path.insert(1, str(Path(__file__).parents[1]))  # rerankmodel_gen: the fake API server

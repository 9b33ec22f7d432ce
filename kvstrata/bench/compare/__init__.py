"""`kvstrata bench compare`: each engine (kvstrata, vLLM CPU, llama.cpp) started in turn on the same model and
driven by the same workload and client; the engines, the workload registry, the table and the plots."""

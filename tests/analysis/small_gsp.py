"""A small GSP cell (96 requests, 6 groups) the analysis tests run in seconds."""

SMALL_GSP = [
    "workload.num_queries=96",
    "workload.num_groups=6",
    "workload.prompts_per_group=null",
    "workload.system_prompt_len_range=[200,400]",
    "workload.question_len=32",
]

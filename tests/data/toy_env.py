"""A user environment in one file (docs/environments.md, "Writing an environment"): count the letter
`a`. The model may ask `count?` (its turn ends there) and gets the number of a's in the word back."""
from rlft.envs import Environment, Reply, Score

WORDS = ["banana", "apple", "cherry", "avocado", "kiwi", "papaya", "grape", "mango"]


class CountA(Environment):
    name = "count_a"
    stop = ("count?",)
    max_turns = 3

    def rows(self, split):
        words = WORDS[:6] if split == "train" else WORDS[6:]
        return [{"prompt": f"How many a in {w}?", "word": w, "answer": str(w.count("a"))} for w in words]

    def step(self, row, transcript):
        return Reply(text=f" {row['word'].count('a')}.", tool_call=True)

    def score(self, row, completion):
        answer = completion.strip().split()[-1] if completion.strip() else None
        ok = answer == row["answer"]
        return Score(reward=float(ok), correct=ok, answer=answer)

    def demonstration(self, row):
        return [("count?", True), (f" {row['answer']}.", False), (f" {row['answer']}", True)]

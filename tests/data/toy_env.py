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


class DigitTool(Environment):
    """For the tests' random tiny models, which write digits often: every digit ends the model's turn
    and the environment replies ` [n]` (n: the digits so far, mod 10); a trajectory is rewarded for
    its length's parity, so rewards differ within a group and the update moves the weights."""
    name = "digit_tool"
    stop = tuple("0123456789")
    max_turns = 3

    def rows(self, split):
        return [{"prompt": f"Q: {i} and {i + 1}?", "answer": str(i)} for i in range(24 if split == "train" else 6)]

    def step(self, row, transcript):
        return Reply(text=f" [{sum(c.isdigit() for c in transcript) % 10}]", tool_call=True)

    def score(self, row, completion):
        return Score(reward=float(len(completion) % 2), correct=row["answer"] in completion, answer=None)

    def demonstration(self, row):
        return [(f"{row['answer']}", True), (" [1]", False), (" done", True)]

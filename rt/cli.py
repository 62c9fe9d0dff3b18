def main():
    print("pkrt")

@echo off
rem README (Windows) command 2, after the preset build: the whole path from text to text, as examples/quickstart.sh
rem does on Linux, on this repository's own text (README.md and LICENSE; bench\RESULTS.md held out): learn a
rem byte-level BPE tokenizer, tokenize into shards, train a small GPT-2 on the CPU with a DeepSpeed config while the
rem loss on the held-out text is measured, and print a sample of what it learned.
rem ZERORUN_EXE (default: the preset builds' zerorun.exe), STEPS (default 400) and DEVICE (default cpu; cuda for the
rem GPU) change it. CI runs it under wine.
setlocal
rem (the exit status tested after each step, not "|| exit /b": wine's cmd, which CI runs this under, mishandles ||;
rem "neq 0", not "if errorlevel 1": a crash's status, 0xC0000005 and the like, is negative)
cd /d "%~dp0.."
set "ZR=%ZERORUN_EXE%"
if "%ZR%"=="" if exist build-msvc\Release\zerorun.exe set "ZR=build-msvc\Release\zerorun.exe"
if "%ZR%"=="" if exist build-msvc-cpu\Release\zerorun.exe set "ZR=build-msvc-cpu\Release\zerorun.exe"
if "%ZR%"=="" (
  echo quickstart: no zerorun.exe: build it first with
  echo   cmake --preset windows-msvc-cuda ^&^& cmake --build --preset windows-msvc-cuda
  exit /b 1
)
if "%STEPS%"=="" set STEPS=400
if "%DEVICE%"=="" set DEVICE=cpu
set Q=runs/quickstart
if exist runs\quickstart rmdir /s /q runs\quickstart
mkdir runs\quickstart
rem bench\RESULTS.md first: --val_docs 1 makes it the held-out document.
"%ZR%" tokenizer bench/RESULTS.md README.md LICENSE --vocab_size 1024 -o %Q%/tokenizer
if %errorlevel% neq 0 exit /b 1
"%ZR%" prepare bench/RESULTS.md README.md LICENSE --tokenizer %Q%/tokenizer -o %Q%/text --val_docs 1 --quiet
if %errorlevel% neq 0 exit /b 1
"%ZR%" init --arch gpt2 --vocab 1024 --n_ctx 128 --n_embd 128 --n_layer 4 --n_head 4 -o %Q%/model.bin
if %errorlevel% neq 0 exit /b 1
"%ZR%" train %Q%/model.bin --device %DEVICE% --config configs/quickstart_cpu.json --seq_len 128 --data "%Q%/text_0*.bin" --eval_data "%Q%/text_val_*.bin" --eval_interval 50 --steps %STEPS% --log_dir %Q% --save_dir %Q%/checkpoints
if %errorlevel% neq 0 exit /b 1
echo --- a sample (zerorun sample %Q%/checkpoints --tokenizer %Q%/tokenizer):
"%ZR%" sample %Q%/checkpoints --tokenizer %Q%/tokenizer --prompt "zerorun" --max_new_tokens 120 --temperature 0.8 --top_k 40 --seed 1
if %errorlevel% neq 0 exit /b 1

module libmoe.dev/moe

go 1.19

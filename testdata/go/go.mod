module proxywasm.test/guests

go 1.24

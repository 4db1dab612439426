import CSupport
import Foundation
@testable import ProtectedStore
@testable import ProtectedStoreCore
@testable import ProtectedStoreMount
import SystemPackage
import Testing

/// What everyday tools and pjdfstest found the mount did differently from ext4: symbolic links moved or linked into
/// another folder, hard links' other names, names over 255 bytes, extended attributes and ACLs (`cp -a`,
/// `rsync -aHAX`, `tar --xattrs --acls`).
extension MountTests {
    // MARK: Symbolic links

    @Test("a symbolic link moved or hard-linked into another folder reads its target; one stored by an earlier version is re-sealed when it moves", arguments: MountTransport.testable)
    func symbolicLinksSurviveMoves(transport: MountTransport) throws {
        let mounted = try MountedDevice(transport: transport)
        for folder in ["Documents/a", "Documents/b", "Library/c"] {
            try FileManager.default.createDirectory(atPath: mounted.path(folder), withIntermediateDirectories: false)
        }
        writeRaw(Array("target".utf8), mounted.path("Documents/x.txt"))
        #expect(symlink("../x.txt", mounted.path("Documents/a/link")) == 0)
        #expect(rename(mounted.path("Documents/a/link"), mounted.path("Documents/b/link")) == 0)
        #expect(try linkTarget(mounted.path("Documents/b/link")) == "../x.txt")
        #expect(readRaw(mounted.path("Documents/b/link")) == Array("target".utf8), "followed from its new folder")
        var info = stat()
        #expect(lstat(mounted.path("Documents/b/link"), &info) == 0 && info.st_size == 8, "ext4 shows the target's length")
        #expect(link(mounted.path("Documents/b/link"), mounted.path("Library/c/hard")) == 0)
        #expect(try linkTarget(mounted.path("Library/c/hard")) == "../x.txt", "a hard link of the link, in another folder")
        #expect(try linkTarget(mounted.path("Documents/b/link")) == "../x.txt")
        try mounted.container.moveItem(atPath: "Library/c/hard", toPath: "Documents/a/hard")
        #expect(try linkTarget(mounted.path("Documents/a/hard")) == "../x.txt", "moved by the library")

        // A link as an earlier version stored it: its target sealed to its folder.
        let folder = try mounted.container.directory.openDirectory(.root.appendingComponents(["Documents", "a"]))
        let entry = try folder.entry(for: "old")
        let bound = try folder.names.cipher.directoryBoundLinkTarget("../x.txt", directoryIV: folder.names.iv)
        #expect(symlinkat(bound, folder.descriptor.rawValue, entry) == 0)
        #expect(NameCipher.isBoundToDirectory(linkTarget: bound))
        #expect(try linkTarget(mounted.path("Documents/a/old")) == "../x.txt", "read where it was made")
        #expect(rename(mounted.path("Documents/a/old"), mounted.path("Documents/b/old")) == 0)
        #expect(try linkTarget(mounted.path("Documents/b/old")) == "../x.txt", "re-sealed as it moved")
        let moved = try mounted.container.directory.openDirectory(.root.appendingComponents(["Documents", "b"]))
        let stored = try FileLocation(directory: moved.descriptor, name: try moved.entry(for: "old"), displayPath: "old").readLink()
        #expect(!NameCipher.isBoundToDirectory(linkTarget: stored), "stored as \(stored)")
        withExtendedLifetime((folder, moved)) {}
        #expect(!mounted.log.contains("does not decrypt"), "\(mounted.log)")
    }

    // MARK: Hard links

    @Test("after ln, chmod, chown, truncate and a rename over one name, stat through the other agrees at once", arguments: MountTransport.testable)
    func hardLinksAgreeAtOnce(transport: MountTransport) throws {
        let mounted = try MountedDevice(transport: transport)
        let first = mounted.path("Documents/first"), second = mounted.path("Library/second")
        writeRaw(Array("twelve bytes".utf8), first)
        var one = stat(), two = stat()
        #expect(stat(first, &one) == 0 && one.st_nlink == 1, "the kernel now holds the first name's attributes")
        #expect(link(first, second) == 0)
        #expect(stat(first, &one) == 0 && one.st_nlink == 2, "nlink through the first name: \(one.st_nlink)")
        #expect(chmod(second, 0o604) == 0)
        #expect(stat(first, &one) == 0 && one.st_mode & 0o7777 == 0o604, "mode \(String(one.st_mode & 0o7777, radix: 8))")
        #expect(chown(first, 4321, 8765) == 0)
        #expect(stat(second, &two) == 0 && two.st_uid == 4321 && two.st_gid == 8765, "owner \(two.st_uid):\(two.st_gid)")
        #expect(truncate(second, 5) == 0)
        #expect(stat(first, &one) == 0 && one.st_size == 5, "size \(one.st_size)")
        let fd = open(first, O_WRONLY | O_APPEND)
        #expect(fd >= 0 && write(fd, "!!", 2) == 2)
        #expect(fchmod(fd, 0o640) == 0)
        close(fd)
        #expect(eventually { stat(second, &two) == 0 && two.st_size == 7 && two.st_mode & 0o7777 == 0o640 }, "size \(two.st_size)")
        #expect(stat(second, &two) == 0 && stat(first, &one) == 0 && one.st_ctim.tv_sec == two.st_ctim.tv_sec && one.st_ctim.tv_nsec == two.st_ctim.tv_nsec)
        let other = mounted.path("Documents/other")
        writeRaw(Array("other".utf8), other)
        #expect(rename(other, second) == 0)
        #expect(stat(first, &one) == 0 && one.st_nlink == 1, "a rename over the second name leaves one: \(one.st_nlink)")
        #expect(unlink(second) == 0 && link(first, second) == 0 && unlink(first) == 0)
        #expect(stat(second, &two) == 0 && two.st_nlink == 1, "after unlink of the first: \(two.st_nlink)")
    }

    // MARK: Long names

    @Test("a name over 255 bytes is ENAMETOOLONG for every call, as on ext4; 255 bytes work", arguments: MountTransport.testable)
    func namesOverMaximumLength(transport: MountTransport) throws {
        let mounted = try MountedDevice(transport: transport)
        let existing = mounted.path("Documents/existing")
        writeRaw(Array("x".utf8), existing)
        for length in [256, 1025] {
            let long = mounted.path("Documents/" + String(repeating: "n", count: length))
            #expect(posixError(Int(open(long, O_CREAT | O_WRONLY, 0o600))) == ENAMETOOLONG, "create, \(length) bytes")
            var info = stat()
            #expect(posixError(Int(stat(long, &info))) == ENAMETOOLONG, "lookup")
            #expect(posixError(Int(mkdir(long, 0o700))) == ENAMETOOLONG, "mkdir")
            #expect(posixError(Int(rename(existing, long))) == ENAMETOOLONG, "rename")
            #expect(posixError(Int(symlink("existing", long))) == ENAMETOOLONG, "symlink")
            #expect(posixError(Int(link(existing, long))) == ENAMETOOLONG, "link")
            #expect(posixError(Int(mkfifo(long, 0o600))) == ENAMETOOLONG, "mkfifo")
            #expect(posixError(Int(stat(long + "/below", &info))) == ENAMETOOLONG, "a long component on the way")
        }
        let longest = mounted.path("Documents/" + String(repeating: "é", count: 127) + "x")
        writeRaw(Array("longest".utf8), longest)
        #expect(readRaw(longest) == Array("longest".utf8), "255 bytes")
        #expect(rename(existing, mounted.path("Documents/" + String(repeating: "m", count: 255))) == 0)
        #expect(FileManager.default.fileExists(atPath: mounted.path("Documents/" + String(repeating: "m", count: 255))))
    }

    // MARK: Extended attributes

    @Test("user.* attributes: set, get, list, replace, remove as ext4 (flags, ENODATA, ENOSPC past the capacity, EPERM on links and FIFOs); stored sealed; tampering is EIO", arguments: MountTransport.testable)
    func userAttributes(transport: MountTransport) throws {
        let mounted = try MountedDevice(transport: transport)
        let file = mounted.path("Documents/tagged.txt")
        writeRaw(Array("tagged".utf8), file)
        let binary = (0..<2000).map { UInt8($0 % 251) }
        #expect(setxattr(file, "user.colour", "green", 5, 0) == 0)
        #expect(setxattr(file, "user.blob", binary, binary.count, 0) == 0)
        #expect(try attributeValue(file, "user.colour") == Array("green".utf8))
        #expect(try attributeValue(file, "user.blob") == binary)
        #expect(try listedAttributes(file) == ["user.colour", "user.blob"], "the class is never listed")
        #expect(posixError(Int(setxattr(file, "user.colour", "red", 3, 1))) == EEXIST, "XATTR_CREATE of an existing one")
        #expect(posixError(Int(setxattr(file, "user.shape", "round", 5, 2))) == ENODATA, "XATTR_REPLACE of a missing one")
        #expect(setxattr(file, "user.colour", "red", 3, 2) == 0)
        #expect(try attributeValue(file, "user.colour") == Array("red".utf8))
        #expect(setxattr(file, "user.empty", "", 0, 0) == 0)
        #expect(try attributeValue(file, "user.empty") == [])
        #expect(posixError(Int(getxattr(file, "user.shape", nil, 0))) == ENODATA)
        #expect(posixError(Int(removexattr(file, "user.shape"))) == ENODATA)
        #expect(posixError(Int(setxattr(file, "trusted.note", "x", 1, 0))) == EOPNOTSUPP)
        #expect(posixError(Int(setxattr(file, "user.", "x", 1, 0))) == EINVAL)
        let tooMuch = [UInt8](repeating: 7, count: SealedAttributes.capacity)
        #expect(posixError(Int(setxattr(file, "user.huge", tooMuch, tooMuch.count, 0))) == ENOSPC)
        #expect(try listedAttributes(file) == ["user.colour", "user.blob", "user.empty"], "a failed set changes nothing")
        #expect(removexattr(file, "user.blob") == 0)
        #expect(try listedAttributes(file) == ["user.colour", "user.empty"])

        // Stored as one sealed attribute: neither names nor values in clear.
        let documents = try mounted.container.directory.openDirectory(.root.appendingComponents(["Documents"]))
        let stored = "/proc/self/fd/\(documents.descriptor.rawValue)/\(try documents.entry(for: "tagged.txt"))"
        let names = try listedAttributes(stored)
        #expect(names == [SealedAttributes.storedName], "\(names)")
        let sealed = try attributeValue(stored, SealedAttributes.storedName)
        #expect(!contains(sealed, "colour") && !contains(sealed, "red") && !contains(sealed, "empty"))

        // Directories take them; symbolic links, FIFOs and Inbox items don't.
        let folder = mounted.path("Documents/folder")
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: false)
        #expect(setxattr(folder, "user.kind", "folder", 6, 0) == 0)
        #expect(try listedAttributes(folder) == ["user.kind"])
        #expect(symlink("tagged.txt", mounted.path("Documents/link")) == 0)
        #expect(posixError(Int(lsetxattr(mounted.path("Documents/link"), "user.x", "1", 1, 0))) == EPERM)
        #expect(try attributeValue(mounted.path("Documents/link"), "user.colour") == Array("red".utf8), "followed")
        #expect(mkfifo(mounted.path("Documents/fifo"), 0o600) == 0)
        #expect(posixError(Int(setxattr(mounted.path("Documents/fifo"), "user.x", "1", 1, 0))) == EPERM)
        let delivered = mounted.test.path("delivered.txt")
        writeRaw(Array("in".utf8), delivered)
        #expect(try sandboxctl(mounted.test, ["inbox", "deliver", TestDevice.bundleIdentifier, delivered]).status == 0)
        #expect(posixError(Int(setxattr(mounted.path("Documents/Inbox/delivered.txt"), "user.x", "1", 1, 0))) == EACCES)

        // Tampered with: EIO and the log names the item, never an empty list.
        var damaged = sealed
        damaged[damaged.count / 2] ^= 0x20
        #expect(setxattr(stored, SealedAttributes.storedName, damaged, damaged.count, 0) == 0)
        #expect(posixError(Int(getxattr(file, "user.colour", nil, 0))) == EIO)
        #expect(posixError(Int(listxattr(file, nil, 0))) == EIO)
        #expect(eventually { mounted.log.contains("do not decrypt") }, "\(mounted.log)")
        withExtendedLifetime(documents) {}
    }

    @Test("user.protection.class is read and set but never listed; removing it gives a file its folder's class")
    func protectionClassIsNotListed() throws {
        let mounted = try MountedDevice()
        let folder = mounted.path("Documents/open")
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: false)
        #expect(setxattr(folder, ContainerFileSystem.protectionAttribute, "D", 1, 0) == 0)
        let file = "\(folder)/f.txt"
        writeRaw(Array("f".utf8), file)
        #expect(try xattr(file) == "none")
        #expect(setxattr(file, ContainerFileSystem.protectionAttribute, "A", 1, 0) == 0)
        #expect(try listedAttributes(file) == [] && listedAttributes(folder) == [])
        #expect(removexattr(file, ContainerFileSystem.protectionAttribute) == 0)
        #expect(try xattr(file) == "none", "the folder's class")
        #expect(mounted.container.protection(of: "Documents/open/f.txt")?.rawValue == FileProtectionType.none.rawValue)
    }

    // MARK: ACLs

    @Test("POSIX ACLs as on ext4: setfacl and getfacl, the mask follows chmod, a default ACL passes to new files and folders, setfacl -b removes", arguments: MountTransport.testable)
    func accessControlLists(transport: MountTransport) throws {
        guard canRun("the mount's ACL tests", unless: Self.missingTools(["setfacl", "getfacl"])) else { return }
        let mounted = try MountedDevice(transport: transport)
        let file = mounted.path("Documents/shared.txt")
        writeRaw(Array("shared".utf8), file)
        #expect(chmod(file, 0o640) == 0)
        #expect(try Self.shell("setfacl -m u:65534:rw,g:65534:r '\(file)'").status == 0)
        var info = stat()
        #expect(stat(file, &info) == 0 && info.st_mode & 0o777 == 0o660, "the group bits show the mask: \(String(info.st_mode & 0o777, radix: 8))")
        let acl = try Self.shell("getfacl -c -n '\(file)'").output
        #expect(acl.contains("user:65534:rw-") && acl.contains("group:65534:r--") && acl.contains("mask::rw-"), "\(acl)")
        #expect(chmod(file, 0o600) == 0)
        #expect(try Self.shell("getfacl -c -n '\(file)'").output.contains("mask::---"), "chmod sets the mask")
        #expect(try Self.shell("setfacl -b '\(file)'").status == 0)
        #expect(try listedAttributes(file) == [])
        #expect(posixError(Int(getxattr(file, "system.posix_acl_access", nil, 0))) == ENODATA)

        let folder = mounted.path("Documents/team")
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: false)
        #expect(try Self.shell("setfacl -d -m u:65534:rwx '\(folder)'").status == 0)
        writeRaw(Array("new".utf8), "\(folder)/new.txt")
        try FileManager.default.createDirectory(atPath: "\(folder)/sub", withIntermediateDirectories: false)
        #expect(try Self.shell("getfacl -c -n '\(folder)/new.txt'").output.contains("user:65534:rwx"), "a new file takes the default ACL")
        let sub = try Self.shell("getfacl -c -n '\(folder)/sub'").output
        #expect(sub.contains("default:user:65534:rwx") && sub.contains("\nuser:65534:rwx"), "a new folder takes it as its own and as its default: \(sub)")
        // version 2; the owner rwx, the group r-x, others r-x (tag, permissions, id: -1 for these)
        let defaultACL: [UInt8] = [2, 0, 0, 0, 1, 0, 7, 0, 255, 255, 255, 255, 4, 0, 5, 0, 255, 255, 255, 255, 0x20, 0, 5, 0, 255, 255, 255, 255]
        #expect(posixError(Int(setxattr(file, "system.posix_acl_default", defaultACL, defaultACL.count, 0))) == EACCES, "a default ACL only on folders")
    }

    @Test("while no item can have an ACL, ls -l's question is answered without the store: the first ACL set through a mount is recorded in the data directory first, and so is a default ACL the data directory inherited, which outlives its removal")
    func aclRecord() throws {
        guard canRun("the ACL record test", unless: Self.missingTools(["setfacl", "getfacl"])) else { return }
        let test = try TestDevice()
        let container = try test.makeContainer()
        let view = ContainerFileSystem(container: container)
        let record = (container.dataPath as NSString).appendingPathComponent(ACLUse.recordName)
        for name in ["a.txt", "b.txt"] { view.release(try view.create("/Documents/\(name)", mode: 0o640)) }
        // Set beside every mount, before any record: not looked for (what DESIGN.md says such a change gets).
        #expect(try Self.shell("setfacl -m u:65534:r '\(try container.storedPath("Documents/a.txt"))'").status == 0)
        #expect(throws: Errno.noData) { try view.extendedAttribute("/Documents/a.txt", name: "system.posix_acl_access") }
        #expect(!FileManager.default.fileExists(atPath: record))
        // version 2; user::rw-, user:65534:r--, group::r--, mask::r--, other::--- (tag, permissions, id: -1 but for the user)
        let acl: [UInt8] = [2, 0, 0, 0, 1, 0, 6, 0, 255, 255, 255, 255, 2, 0, 4, 0, 0xFE, 0xFF, 0, 0, 4, 0, 4, 0, 255, 255, 255, 255,
                            0x10, 0, 4, 0, 255, 255, 255, 255, 0x20, 0, 0, 0, 255, 255, 255, 255]
        try view.setExtendedAttribute("/Documents/b.txt", name: "system.posix_acl_access", value: acl, flags: 0)
        #expect(FileManager.default.fileExists(atPath: record), "recorded, so every later mount asks the store")
        #expect(try view.extendedAttribute("/Documents/a.txt", name: "system.posix_acl_access") == acl, "this mount asks now")
        let later = ContainerFileSystem(container: container)
        #expect(try later.extendedAttribute("/Documents/b.txt", name: "system.posix_acl_access") == acl, "a later mount reads it")
        #expect(try Self.shell("getfacl -c -n '\(try container.storedPath("Documents/b.txt"))'").output.contains("user:65534:r--"), "the stored file's own")

        // A data directory made under a default ACL passes it to what is made in it; what it passed stays shown after
        // it is removed.
        let inheriting = try TestDevice()
        let containers = (inheriting.root as NSString).appendingPathComponent("containers")
        for folder in [inheriting.root, containers] where FileManager.default.fileExists(atPath: folder) {
            #expect(try Self.shell("setfacl -d -m u:65534:rwx '\(folder)'").status == 0)
        }
        let inherited = try inheriting.makeContainer()
        let inheritedView = ContainerFileSystem(container: inherited)
        inheritedView.release(try inheritedView.create("/Documents/b.txt", mode: 0o640))
        #expect(try inheritedView.extendedAttribute("/Documents/b.txt", name: "system.posix_acl_access").count > 4, "the inherited ACL is shown")
        #expect(FileManager.default.fileExists(atPath: (inherited.dataPath as NSString).appendingPathComponent(ACLUse.recordName)), "and recorded")
        #expect(try Self.shell("setfacl -k '\(inherited.dataPath)'").status == 0)
        #expect(try ContainerFileSystem(container: inherited).extendedAttribute("/Documents/b.txt", name: "system.posix_acl_access").count > 4,
                "still shown by a later mount once the data directory's default ACL is gone")
    }

    @Test("new files, folders and FIFOs get the modes and ACLs ext4 gives them: the umask, or a folder's default ACL masked by the mode", arguments: MountTransport.testable)
    func newItemsAsOnExt4(transport: MountTransport) throws {
        guard canRun("the mount's ACL tests", unless: Self.missingTools(["setfacl", "getfacl"])) else { return }
        let mounted = try MountedDevice(transport: transport)
        let script = """
            set -e; umask 027
            mkdir plain team; touch plain/file; mkfifo plain/fifo; mkdir plain/folder
            setfacl -d -m u:65534:rwx,g::r-x,m:rwx team; touch team/file; mkfifo team/fifo; mkdir team/folder
            (umask 0; mkdir team/open; touch team/open-file); chmod 2775 team; mkdir team/below; touch team/below/file
            python3 -c 'import os; os.close(os.open("team/narrow", os.O_CREAT | os.O_WRONLY, 0o640)); os.mkdir("team/narrow-folder", 0o510)'
            """
        let onExt4 = mounted.test.path("ext4")
        try FileManager.default.createDirectory(atPath: onExt4, withIntermediateDirectories: false)
        for place in [onExt4, mounted.path("Documents")] {
            let made = try Self.shell("cd '\(place)' && \(script)")
            #expect(made.status == 0, "\(place): \(made.output)")
        }
        let trees = ["plain", "team"]
        try Self.expectSame(try trees.map { try Self.attributesOfTree(mounted.path("Documents/\($0)"), times: false) }.joined(),
                            try trees.map { try Self.attributesOfTree("\(onExt4)/\($0)", times: false) }.joined(), "new items through the mount and on ext4")
    }

    // MARK: Copy tools

    @Test("cp -a, rsync -aHAX and tar --xattrs --acls copy a tree into the mount and back with every attribute, ACL, hard link and symlink; rsync -aX exits 0", arguments: MountTransport.testable)
    func copyToolsRoundTrip(transport: MountTransport) throws {
        guard canRun("the mount's copy-tool round trips", unless: Self.missingTools(["rsync", "setfacl", "getfacl", "getfattr", "tar"])) else { return }
        let mounted = try MountedDevice(transport: transport)
        let source = mounted.test.path("source")
        let made = try Self.shell("""
            set -e; mkdir -p '\(source)/sub/deeper'; cd '\(source)'
            printf 'one' > one.txt; printf 'two' > sub/two.txt; head -c 300000 /dev/urandom > sub/deeper/big.bin
            ln one.txt sub/one-again.txt; ln -s ../one.txt sub/link; mkfifo sub/fifo
            setfattr -n user.colour -v green one.txt; setfattr -n user.empty sub/two.txt; setfattr -n user.folder -v yes sub
            setfattr -n user.binary -v 0x00ff10 sub/deeper/big.bin
            chmod 0640 one.txt; chmod 2775 sub; setfacl -m u:65534:r one.txt; setfacl -d -m g:65534:rx sub/deeper
            touch -d '2001-02-03 04:05:06' sub/two.txt
            # rsync sets a FIFO's time only when its seconds differ (so on ext4 too)
            touch -d '2002-03-04 05:06:07' sub/fifo
            """)
        #expect(made.status == 0, "\(made.output)")
        let copies = [
            ("cp -a", "cp -a '\(source)' '\(mounted.path("Documents/cp"))'", "cp -a '\(mounted.path("Documents/cp"))' '\(mounted.test.path("cp-back"))'",
             mounted.path("Documents/cp"), mounted.test.path("cp-back")),
            ("rsync -aHAX", "rsync -aHAX '\(source)/' '\(mounted.path("Documents/rsync"))/'", "rsync -aHAX '\(mounted.path("Documents/rsync"))/' '\(mounted.test.path("rsync-back"))/'",
             mounted.path("Documents/rsync"), mounted.test.path("rsync-back")),
            ("tar --xattrs --acls", "mkdir '\(mounted.path("Documents/tar"))' && tar --format=posix --xattrs --xattrs-include='user.*' --acls -C '\(source)' -cf - . | tar --format=posix --xattrs --xattrs-include='user.*' --acls -C '\(mounted.path("Documents/tar"))' -xf -",
             "mkdir '\(mounted.test.path("tar-back"))' && tar --format=posix --xattrs --xattrs-include='user.*' --acls -C '\(mounted.path("Documents/tar"))' -cf - . | tar --format=posix --xattrs --xattrs-include='user.*' --acls -C '\(mounted.test.path("tar-back"))' -xf -",
             mounted.path("Documents/tar"), mounted.test.path("tar-back")),
        ]
        let original = try Self.attributesOfTree(source)
        for (tool, into, back, inMount, outside) in copies {
            let result = try Self.shell(into)
            #expect(result.status == 0, "\(tool) into the mount: \(result.output)")
            try Self.expectSame(try Self.attributesOfTree(inMount), original, "\(tool) into the mount")
            let returned = try Self.shell(back)
            #expect(returned.status == 0, "\(tool) back out: \(returned.output)")
            try Self.expectSame(try Self.attributesOfTree(outside), original, "\(tool) back out")
            var one = stat(), again = stat()
            #expect(lstat("\(inMount)/one.txt", &one) == 0 && lstat("\(inMount)/sub/one-again.txt", &again) == 0 && one.st_ino == again.st_ino,
                    "\(tool) keeps the hard link")
            #expect(readRaw("\(inMount)/sub/deeper/big.bin") == readRaw("\(source)/sub/deeper/big.bin"))
        }
        // Again onto what is there: nothing to change, still exit 0; and -X alone, whose removals once failed.
        #expect(try Self.shell("rsync -aHAX '\(source)/' '\(mounted.path("Documents/rsync"))/'").status == 0)
        let plain = try Self.shell("rsync -aX '\(source)/' '\(mounted.path("Documents/rsync-x"))/' && rsync -aX '\(mounted.path("Documents/rsync-x"))/' '\(mounted.path("Documents/rsync-x2"))/'")
        #expect(plain.status == 0, "\(plain.output)")
        #expect(!mounted.log.contains("error"), "\(mounted.log)")
    }

    // MARK: Other users

    @Test("--allow-other: another user meets ext4's checks (modes, ACLs, chmod and chown by owners only, sticky folders, open modes) and owns what it makes", arguments: MountTransport.testable)
    func otherUsersMeetPermissionChecks(transport: MountTransport) throws {
        guard canRun("the mount's checks for other users", unless: geteuid() != 0 ? "acting as another user needs root" : Self.missingTools(["setpriv", "setfacl"]) ?? (FileManager.default.isExecutableFile(atPath: "/usr/bin/python3") ? nil : "/usr/bin/python3 is missing")) else { return }
        let mounted = try MountedDevice(transport: transport, allowOther: true)
        for directory in [mounted.test.directory.path, mounted.mountPoint] { #expect(chmod(directory, 0o755) == 0) }
        let documents = mounted.path("Documents")
        #expect(chmod(documents, 0o1777) == 0, "sticky, writable by all")
        for (name, mode) in [("public.txt", 0o644), ("private.txt", 0o600), ("acl.txt", 0o600)] {
            writeRaw(Array("root's \(name)".utf8), "\(documents)/\(name)")
            #expect(chmod("\(documents)/\(name)", mode_t(mode)) == 0)
        }
        #expect(try Self.shell("setfacl -m u:65534:r '\(documents)/acl.txt'").status == 0)
        try FileManager.default.createDirectory(atPath: "\(documents)/closed", withIntermediateDirectories: false)
        writeRaw(Array("inside".utf8), "\(documents)/closed/inside.txt")
        #expect(chmod("\(documents)/closed", 0o700) == 0)

        let script = """
            import errno, json, os, sys
            os.umask(0o022)
            folder = sys.argv[1]
            results = {}
            def attempt(name, action):
                try:
                    action()
                    results[name] = "ok"
                except OSError as error:
                    results[name] = errno.errorcode[error.errno]
            def path(name): return os.path.join(folder, name)
            def write(name, text):
                with open(path(name), "w") as f: f.write(text)
            attempt("read public", lambda: open(path("public.txt")).read())
            attempt("read private", lambda: open(path("private.txt")).read())
            attempt("read through an ACL", lambda: open(path("acl.txt")).read())
            attempt("open public for writing", lambda: open(path("public.txt"), "r+"))
            attempt("truncate public", lambda: os.truncate(path("public.txt"), 0))
            attempt("create", lambda: write("mine.txt", "mine"))
            attempt("chmod own", lambda: os.chmod(path("mine.txt"), 0o640))
            attempt("chmod root's", lambda: os.chmod(path("public.txt"), 0o666))
            attempt("chown own to root", lambda: os.chown(path("mine.txt"), 0, -1))
            attempt("chown root's", lambda: os.chown(path("public.txt"), 65534, -1))
            attempt("remove root's in a sticky folder", lambda: os.unlink(path("public.txt")))
            attempt("rename root's in a sticky folder", lambda: os.rename(path("public.txt"), path("moved.txt")))
            attempt("list a closed folder", lambda: os.listdir(path("closed")))
            attempt("stat in a closed folder", lambda: os.stat(path("closed/inside.txt")))
            attempt("mkdir", lambda: os.mkdir(path("mine"), 0o777))
            attempt("set an attribute of root's", lambda: os.setxattr(path("public.txt"), "user.note", b"x"))
            attempt("set an attribute of own", lambda: os.setxattr(path("mine.txt"), "user.note", b"x"))
            attempt("create and remove", lambda: (write("gone.txt", "x"), os.unlink(path("gone.txt"))))
            print(json.dumps(results))
            """
        let run = try CLI.run(executable: URL(fileURLWithPath: FUSEAvailability.executable("setpriv") ?? "/usr/bin/setpriv"),
                              ["--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", script, documents])
        #expect(run.status == 0, "\(run.stderr)")
        let results = try JSONDecoder().decode([String: String].self, from: Data(run.stdout.utf8))
        let expected = [
            "read public": "ok", "read private": "EACCES", "read through an ACL": "ok", "open public for writing": "EACCES",
            "truncate public": "EACCES", "create": "ok", "chmod own": "ok", "chmod root's": "EPERM", "chown own to root": "EPERM",
            "chown root's": "EPERM", "remove root's in a sticky folder": "EPERM", "rename root's in a sticky folder": "EPERM",
            "list a closed folder": "EACCES", "stat in a closed folder": "EACCES", "mkdir": "ok",
            "set an attribute of root's": "EACCES", "set an attribute of own": "ok", "create and remove": "ok",
        ]
        for (check, answer) in expected.sorted(by: { $0.key < $1.key }) {
            #expect(results[check] == answer, "\(check): \(results[check] ?? "not run")")
        }
        var info = stat()
        #expect(stat("\(documents)/mine.txt", &info) == 0 && info.st_uid == 65534 && info.st_gid == 65534 && info.st_mode & 0o7777 == 0o640,
                "owner \(info.st_uid):\(info.st_gid), mode \(String(info.st_mode & 0o7777, radix: 8))")
        #expect(stat("\(documents)/mine", &info) == 0 && info.st_uid == 65534 && info.st_mode & 0o7777 == 0o755, "the umask applies")
        #expect(readRaw("\(documents)/mine.txt") == Array("mine".utf8))
        #expect(unlink("\(documents)/public.txt") == 0, "the owner still can")
    }

    // MARK: Helpers

    /// getfattr of every `user.` attribute and getfacl of every item but symlinks, relative to `root` and sorted; sizes, modes, times and link counts.
    static func attributesOfTree(_ root: String, times: Bool = true) throws -> String {
        let attributes = try shell("cd '\(root)' && getfattr -R -h -d -m '^user\\.' --absolute-names . 2>&1 | sort")
        let acls = try shell("cd '\(root)' && find . -not -type l -print0 | sort -z | xargs -0 getfacl -n -p 2>&1")
        let modes = try shell("""
            cd '\(root)' && find . -not -type d -not -type l -printf '%p %M %n %s \(times ? "%T@" : "")\\n' | sort
            find . -type l -printf '%p %l\\n' | sort; find . -type d -printf '%p %M\\n' | sort
            """)
        return [attributes.output, acls.output, modes.output].joined(separator: "\n--\n")
    }

    /// Records the difference of two trees' `attributesOfTree`, as diff shows it.
    static func expectSame(_ copy: String, _ original: String, _ what: String) throws {
        guard copy != original else { return }
        let directory = TemporaryDirectory()
        try original.write(toFile: directory.file("original"), atomically: false, encoding: .utf8)
        try copy.write(toFile: directory.file("copy"), atomically: false, encoding: .utf8)
        Issue.record("\(what) differs:\n\(try shell("diff -u '\(directory.file("original"))' '\(directory.file("copy"))'").output)")
    }

    static func shell(_ command: String) throws -> (status: Int32, output: String) {
        let result = try CLI.run(executable: URL(fileURLWithPath: "/bin/bash"), ["-c", command])
        return (result.status, result.stdout + result.stderr)
    }

    static func missingTools(_ tools: [String]) -> String? {
        let missing = tools.filter { FUSEAvailability.executable($0) == nil }
        return missing.isEmpty ? nil : "\(missing.joined(separator: ", ")) not installed (scripts/ensure-deps.sh installs them)"
    }

    private func contains(_ bytes: [UInt8], _ text: String) -> Bool {
        let needle = Array(text.utf8)
        return bytes.count >= needle.count && (0...(bytes.count - needle.count)).contains { Array(bytes[$0..<($0 + needle.count)]) == needle }
    }

    func linkTarget(_ path: String) throws -> String {
        var buffer = [CChar](repeating: 0, count: 4096)
        let length = readlink(path, &buffer, buffer.count)
        guard length >= 0 else { throw Errno(rawValue: errno) }
        return String(decoding: buffer[0..<length].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    func attributeValue(_ path: String, _ name: String) throws -> [UInt8] {
        var buffer = [UInt8](repeating: 0, count: 65536)
        let length = getxattr(path, name, &buffer, buffer.count)
        guard length >= 0 else { throw Errno(rawValue: errno) }
        return Array(buffer[0..<length])
    }

    func listedAttributes(_ path: String) throws -> [String] {
        var buffer = [CChar](repeating: 0, count: 65536)
        let length = listxattr(path, &buffer, buffer.count)
        guard length >= 0 else { throw Errno(rawValue: errno) }
        return buffer[0..<length].split(separator: 0).map { String(decoding: $0.map { UInt8(bitPattern: $0) }, as: UTF8.self) }
    }
}
